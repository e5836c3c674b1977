"""LocAt, Gram anchoring, or both? And is distillation a cheaper road? Five arms at the tiny recipe.

The question a researcher asks first about dense features: does LocAt's attention, DINOv3's Gram
anchoring, both, or distilling a trained run into a LocAt-T give better patch features for the
same budget? This trains, per seed, for the same number of optimizer steps:

- ``dino``: ViT-T/8 with ``configs/dino_tiny_cpu.yaml``;
- ``dino_gram``: the same with Gram anchoring (the recipe's commented block: the EMA teacher of
  the run's middle step as the Gram teacher, refreshed every quarter of the run);
- ``locat``, ``locat_gram``: the same two with ``--model.backbone locatvit_tiny_patch8_224``;
- ``distill``: a LocAtViT-T/8 student of ``configs/distill_tiny_cpu.yaml`` whose frozen teacher
  is the ``dino`` arm's exported run of the same seed (so that arm runs first),

exports each evaluated backbone (``<out>/<arm>/seed<S>/backbone.pth``) and scores it frozen as
``ibot.py`` and ``supervised.py`` do: Hummingbird mIoU and the cached dense linear probe (100
memory / 50 query held-out scenes at 128 px, fp32, exact search; per-query-image confusions kept
for paired intervals) and class-token k-NN on an image-level scene label (``pretraining.py``'s,
with a Wilson interval), each against the same network at random initialisation (the network a
run of that backbone and seed starts from). The network-free floors (``pixels`` and the rest) are
those of ``floor_results.py`` on the same scenes and protocol (benchmarks/RESULTS.md, "Does
pretraining help on the built-in scenes?"), so its table's rows compare with these directly.

Every run appends one JSON line to ``<out>/results.jsonl``; an (arm, seed, steps) already there is
skipped, so the study runs in chunks; ``--table`` prints per arm mean ± std, then each arm's paired
Δ to its random init, ``+ Gram`` against without, LocAt against ViT and distillation against the
LocAt DINO run: per seed, mean ± std over seeds and the interval of the seed-mean Δ::

    for s in 0 1 2; do
      python -m benchmarks.studies.gram_distill --seeds $s --steps 80 --out runs/bench_gram_distill; done
    python -m benchmarks.studies.gram_distill --table --steps 80 --out runs/bench_gram_distill

At 80 steps on the scenes nothing may separate (DINO and iBOT did not beat random init there,
RESULTS.md, "Does pretraining help on the built-in scenes?"): the table is to be written up as measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.studies.gram_arms import ARMS, PAIRS, gram_block
from benchmarks.studies.ibot import _append, _rows  # the same results.jsonl log
from benchmarks.studies.pretraining import ClassTokenKNN
from benchmarks.studies.supervised import (
    CachedSplit,
    _mean_std,
    intervals_numbers,
    open_split,
    paired_intervals,
    paired_rows,
    score,
)
from locatdino.evaluation.wilson import wilson_interval
from locatdino.models import create_backbone
from locatdino.ssl.export.cli import export_backbone
from locatdino.ssl.run import cli as fit_cli

ROOT = Path(__file__).resolve().parents[2]
BACKBONES = {"vit": "vit_tiny_patch16_224", "locatvit": "locatvit_tiny_patch8_224"}  # the recipes' --model.backbone


def gram_flags(steps: int) -> list[str]:
    """``--model.gram`` of :func:`~benchmarks.studies.gram_arms.gram_block` (the DINO recipe's
    commented Gram block scaled to a run of ``steps``)."""
    return ["--model.gram", json.dumps(gram_block(steps))]


def arm_argv(arm: str, seed: int, steps: int, out: Path) -> list[str]:
    """``locatdino fit`` arguments of one arm's run (see the module docstring)."""
    backbone, recipe, gram = ARMS[arm]
    argv = [
        "--config",
        str(ROOT / "configs" / f"{recipe}.yaml"),
        "--model.backbone",
        BACKBONES[backbone],
        "--seed_everything",
        str(seed),
        "--trainer.default_root_dir",
        str(out / arm / f"seed{seed}"),
        "--data.init_args.train_urls",
        str(out / "scenes_shards"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_steps",
        str(steps),
        "--trainer.max_epochs",
        "-1",
    ]
    if gram:
        argv += gram_flags(steps)
    if arm == "distill":
        teacher = out / "dino" / f"seed{seed}" / "backbone.pth"
        argv += ["--model.teacher", f"{BACKBONES['vit']}:{teacher}"]
    return argv


def backbone_kwargs(arm: str) -> dict:
    """The backbone kwargs of an arm's recipe (every arm's: ``{img_size: 64, patch_size: 8}``)."""
    model = yaml.safe_load((ROOT / "configs" / f"{ARMS[arm][1]}.yaml").read_text())["model"]
    return dict(model.get("init_args", model).get("backbone_kwargs") or {})


def _knn(knn: ClassTokenKNN, model: torch.nn.Module) -> dict:
    """k-NN top-1 (%) with its Wilson 95 % interval over the k-NN query scenes."""
    accuracy, n = knn(model), len(knn.val[1])
    low, high = wilson_interval(round(accuracy * n / 100), n)
    return {"knn": round(accuracy, 1), "knn_interval": [round(100 * low, 1), round(100 * high, 1)]}


def run_study(args: argparse.Namespace) -> None:
    out = Path(args.out)
    train_set = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, args.input_size))
    val_set = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, args.input_size))
    knn = ClassTokenKNN(args.knn_train, args.knn_val, 64)  # at the recipes' global crop size
    arms = [a for a in ARMS if a in args.arms]
    if "distill" in arms and "dino" not in arms:
        arms.insert(0, "dino")  # the distill arm's teacher
    for seed in args.seeds:
        for arm in arms:
            done = {(r["arm"], r["seed"], r["steps"]) for r in _rows(out)}
            backbone = ARMS[arm][0]
            if (f"random_{backbone}", seed, 0) not in done:
                folder = out / f"random_{backbone}" / f"seed{seed}"
                (folder / "confusions").mkdir(parents=True, exist_ok=True)
                torch.manual_seed(seed)  # the network every run of this backbone and seed starts from
                model = create_backbone(BACKBONES[backbone], **backbone_kwargs(arm))
                scores = score(model, train_set, val_set, args.input_size, folder / "confusions", "random")
                row = dict(arm=f"random_{backbone}", seed=seed, steps=0, run=str(folder), **scores, **_knn(knn, model))
                _append(out, row)
            if (arm, seed, args.steps) in done:
                print(f"gram_distill: {arm} seed {seed} already in results.jsonl", flush=True)
                continue
            argv = arm_argv(arm, seed, args.steps, out)
            start = time.perf_counter()
            if fit_cli.main(argv):
                raise SystemExit(f"gram_distill: locatdino fit {' '.join(argv)} failed")
            seconds = time.perf_counter() - start
            run = out / arm / f"seed{seed}"
            exported = run / "backbone.pth"
            export_backbone(run / "checkpoints" / "last.ckpt", exported, overwrite=True)
            (run / "confusions").mkdir(exist_ok=True)
            model = create_backbone(BACKBONES[backbone], exported, **backbone_kwargs(arm))
            scores = score(model, train_set, val_set, args.input_size, run / "confusions", "trained")
            row = dict(arm=arm, seed=seed, steps=args.steps, fit_s=round(seconds, 1), run=str(run), argv=argv)
            _append(out, {**row, **scores, **_knn(knn, model)})
            print(f"| {arm} | {seed} | {seconds:.0f} | {scores['hbird']:.2f} | {scores['linprobe']:.2f} |", flush=True)


def table(out: Path, steps: int) -> tuple[str, dict]:
    """Per arm mean ± std (random inits included), then the paired differences of :data:`PAIRS`
    (per seed with intervals, over seeds, and the seed-mean interval); and the numbers behind it."""
    by = {(r["arm"], r["seed"]): r for r in _rows(out) if r["steps"] in (0, steps)}  # a rerun replaces its line
    seeds = sorted({s for _, s in by})
    names = [f"random_{b}" for b in BACKBONES] + list(ARMS)
    lines = ["| arm | seeds | Hummingbird | linear probe | k-NN top-1 | fit s |", "|---|---|---|---|---|---|"]
    for name in names:
        rs = [by[(name, s)] for s in seeds if (name, s) in by]
        if rs:
            fit = _mean_std([r["fit_s"] for r in rs]).lstrip("+") if "fit_s" in rs[0] else "—"
            cells = [_mean_std([r[k] for r in rs]).lstrip("+") for k in ("hbird", "linprobe", "knn")]
            lines.append(f"| {name} | {len(rs)} | {' | '.join(cells)} | {fit} |")
    # the pairs on the seeds every arm has run (a study in progress): one column per seed, every row filled
    complete = [s for s in seeds if all((name, s) in by for name in names)]
    lines += [
        "",
        "| paired difference | metric | "
        + " | ".join(f"seed {s}" for s in complete)
        + " | mean ± std | seed-mean Δ [95 %] |",
        "|---|---|" + "---|" * (len(complete) + 2),
    ]
    paired = {}
    for label, a, b in PAIRS:
        b_name = f"random_{ARMS[a][0]}" if b == "random" else b
        common = [s for s in complete if (a, s) in by and (b_name, s) in by]
        if common:
            tag_b = "random" if b == "random" else "trained"
            paired[label] = paired_intervals(
                [by[(a, s)] for s in common], "trained", [by[(b_name, s)] for s in common], tag_b
            )
            lines += paired_rows(label, paired[label])
    return "\n".join(lines), {"steps": steps, "runs": list(by.values()), "paired": intervals_numbers(paired)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=80, help="optimizer steps of every run (the same budget)")
    p.add_argument("--input-size", type=int, default=128, help="Hummingbird eval px (the demo's)")
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--knn-train", type=int, default=500)
    p.add_argument("--knn-val", type=int, default=200)
    p.add_argument("--out", default="runs/bench_gram_distill")
    p.add_argument("--table", action="store_true", help="print the table of <out>/results.jsonl and stop")
    add_results_option(p, "gram_distill.json")
    args = p.parse_args()
    if args.table:  # the only mode that writes --results
        args.results = results_file(args, "gram_distill.json")
        markdown, numbers = table(Path(args.out), args.steps)
        print(markdown)
        write_results(args.results, "gram_distill.json", numbers)
        return
    torch.set_num_threads(2)
    print("| arm | seed | fit s | Hummingbird | linear probe |\n|---|---|---|---|---|", flush=True)
    run_study(args)


if __name__ == "__main__":
    main()
