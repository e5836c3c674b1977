"""``locatdino demo``: the whole pipeline on the built-in scenes, no download, minutes on a CPU.

It runs the three commands a user runs on real data, printing each one first, so the demo
doubles as a worked example:

1. ``locatdino fit``    — DINO pretraining of a tiny LocAtViT from a recipe (the recipe writes
   the built-in scenes as WebDataset shards on first use);
2. ``locatdino export`` — the EMA teacher's backbone as a plain timm state dict;
3. ``locatdino hbird``  — Hummingbird in-context segmentation of the pretrained teacher against
   the same architecture at random initialisation, one comparison report.
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path

import yaml

from locatdino import cli

DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "tiny_locatvit.yaml"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="locatdino demo",
        description="Pretrain, export and evaluate on the built-in scenes (no download).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="everything the demo writes goes here")
    p.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="locatdino fit config")
    p.add_argument("--max-steps", type=int, default=None, help="training steps (default: the recipe's)")
    p.add_argument("--num-train", type=int, default=100, help="memory images for the evaluation")
    p.add_argument("--num-val", type=int, default=50, help="query images for the evaluation")
    p.add_argument("--input-size", type=int, default=128, help="evaluation input size in px")
    return p


def _run(argv: list[str]) -> None:
    """Run one ``locatdino`` sub-command in this process, after printing it."""
    print(f"\n$ locatdino {shlex.join(argv)}", flush=True)
    status = cli.main(argv)
    if status:
        raise SystemExit(f"locatdino demo: 'locatdino {argv[0]}' failed with exit status {status}")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    backbone = yaml.safe_load(Path(args.recipe).read_text())["model"]["backbone"]
    started = time.perf_counter()

    fit = ["fit", "--config", args.recipe, "--trainer.default_root_dir", str(out / "fit"),
           "--data.init_args.train_urls", str(out / "scenes_shards")]
    if args.max_steps is not None:
        fit += ["--trainer.max_steps", str(args.max_steps)]
    _run(fit)

    teacher = out / "teacher.pth"
    _run(["export", str(out / "fit" / "checkpoints" / "last.ckpt"), str(teacher)])

    _run(["hbird", "--model", backbone, "--checkpoint", "none", "--model", backbone,
          "--checkpoint", str(teacher), "--dataset", "scenes", "--num-train", str(args.num_train),
          "--num-val", str(args.num_val), "--input-size", str(args.input_size), "--out", str(out / "hbird")])

    minutes = (time.perf_counter() - started) / 60
    print(f"\nlocatdino demo: done in {minutes:.1f} min. Report: {out / 'hbird' / 'summary.md'}; "
          f"training curves: {out / 'fit' / 'logs'}")
    return 0
