"""The dense linear probe on the built-in scenes: its cost on the cached path, and whether it
ranks models (random init vs a network trained with the scenes' labels).

100 memory (training) / 50 query scenes rendered at 128 px, the paper's head, optimiser and
schedule, augmentation off (features cached once per image), fp32. Cost: a tiny backbone of the
demo's recipes (built at 64 px, 8 px patches) at the paper's batch 32 and at ``compare``'s
defaults (what ``locatdino compare``, and so the demo for its 4 models, adds). Ranking: the dense
supervised network of ``benchmarks/studies/scenes_ranking.py`` (300 steps classifying every patch's majority
class; built at 64 px with its 16 px patches) against random inits of the same architecture.

    python -m benchmarks.speed.linprobe --threads 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.studies.scenes_ranking import supervised
from locatdino.evaluation.compare.cli import LINPROBE_DEFAULTS
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, linear_probe
from locatdino.evaluation.splits import CachedSplit, open_split
from locatdino.models import create_backbone


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="locatvit_tiny_patch16_224")
    p.add_argument("--img-size", type=int, default=64, help="build resolution (the tiny recipes' 64 px)")
    p.add_argument("--patch-size", type=int, default=8, help="patch of the timed backbone (the demo's recipes)")
    p.add_argument("--input-size", type=int, default=128)
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--iters", type=int, default=400, help="probe iterations at the paper's batch 32")
    p.add_argument("--seeds", type=int, default=3, help="random-init draws")
    p.add_argument("--steps", type=int, default=300, help="supervised training steps (batch 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-ranking", action="store_true", help="only the cost rows")
    add_results_option(p, "linprobe.json")
    args = p.parse_args()
    args.results = results_file(args, "linprobe.json")  # before any measuring
    torch.set_num_threads(args.threads)

    size = args.input_size
    train = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, size, args.num_train))
    val = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, size, args.num_val))
    settings = {
        "paper batch": LinearProbeConfig(
            input_size=size, iterations=args.iters, augment="off", precision="fp32", progress=False
        ),
        "compare default": LinearProbeConfig(
            input_size=size,
            iterations=LINPROBE_DEFAULTS["iterations"],
            batch_size=LINPROBE_DEFAULTS["batch_size"],
            augment="off",
            precision="fp32",
            progress=False,
        ),
    }

    def backbone(seed: int, patch: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return create_backbone(args.model, img_size=args.img_size, patch_size=patch)

    print(
        f"{args.model} built at {args.img_size} px, {args.num_train} / {args.num_val} scenes at {size} px, "
        f"{args.threads} threads, cached path, fp32"
    )
    print("| model | setting | iterations × batch | mIoU | seconds (features / head / total) |\n|---|---|---|---|---|")
    rows: list[dict] = []

    def row(name: str, model: torch.nn.Module, setting: str) -> float:
        cfg = settings[setting]
        start = time.perf_counter()
        result = linear_probe(model, train, val, cfg)
        wall = time.perf_counter() - start
        t = result.timings
        print(
            f"| {name} | {setting} | {cfg.iterations} × {cfg.batch_size} | {result.miou:.1f} | "
            f"{t.get('features', 0):.1f} / {t.get('head', 0):.1f} / {wall:.1f} |",
            flush=True,
        )
        rows.append(
            {
                "model": name,
                "setting": setting,
                "iterations": cfg.iterations,
                "batch_size": cfg.batch_size,
                "miou": result.miou,
                "seconds": {**t, "total": wall},
            }
        )
        write_results(args.results, "linprobe.json", {"rows": rows})
        return result.miou

    for setting in settings:  # cost, on the demo's architecture
        row(f"random init, patch {args.patch_size}", backbone(0, args.patch_size), setting)
    if args.no_ranking:
        return
    randoms = [
        row(f"random init seed {seed}, patch 16", backbone(seed, 16), "paper batch") for seed in range(args.seeds)
    ]
    start = time.perf_counter()
    trained = supervised(args.model, args.img_size, args.steps, 512, seed=0)
    minutes = (time.perf_counter() - start) / 60
    miou = row(f"supervised, patch 16 ({args.steps} steps, {minutes:.1f} min)", trained, "paper batch")
    spread = np.std(randoms, ddof=1) if len(randoms) > 1 else 0.0
    print(
        f"\nsupervised − random init (patch 16, {len(randoms)} seeds): {miou - np.mean(randoms):+.1f} mIoU "
        f"(random init {np.mean(randoms):.1f} ± {spread:.1f})"
    )


if __name__ == "__main__":
    main()
