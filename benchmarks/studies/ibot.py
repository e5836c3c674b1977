"""Does a patch-level objective beat random init at CPU scale? DINO vs iBOT vs random init.

At CPU scale, DINO and supervised runs on the scenes score no better than the network they started
from (benchmarks/RESULTS.md, "Does pretraining help on the built-in scenes?"); one possible cause is
that DINO's loss sits on the class token only. iBOT adds a loss on the masked patch tokens
(docs/pretraining.md). This trains tiny ViT and LocAtViT (patch 8, 64 px) with
``configs/dino_tiny_cpu.yaml`` (DINO) and ``configs/ibot_tiny_cpu.yaml`` (the same recipe plus the
patch loss), each backbone switched in with ``--model.backbone`` for the same number of optimizer
steps and seeds, exports each teacher (``<out>/<backbone>/<objective>/seed<S>/backbone.pth``) and
scores it frozen, as ``supervised.py`` does: Hummingbird mIoU (100 memory / 50 query held-out scenes
at 128 px, fp32, exact search) and the cached dense linear probe, each against the same network at
random initialisation (the network both runs of a seed start from: scored once per backbone and
seed, ``<out>/random/<backbone>/seed<S>``). Per-query-image confusion matrices are kept, so
``--table`` gives paired intervals (docs/evaluation.md).

Every run appends one JSON line to ``<out>/results.jsonl``; a (backbone, objective, seed) already
there is skipped, so the study can run in chunks, one run at a time::

    for s in 0 1 2; do for b in vit locatvit; do for o in dino ibot; do
      python -m benchmarks.studies.ibot --seeds $s --backbones $b \\
          --objectives $o --steps 80 --out runs/bench_ibot; done; done; done
    python -m benchmarks.studies.ibot --table --steps 80 --out runs/bench_ibot \\
        --figure benchmarks/figures/ibot/deltas.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

# the evaluation protocol's names through studies.supervised (one import site)
from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.studies.supervised import (
    CachedSplit,
    _confusions,
    intervals_numbers,
    miou_interval,
    open_split,
    paired_intervals,
    paired_rows,
    score,
    seed_mean_miou_interval,
)
from locatdino.models import create_backbone
from locatdino.ssl.export.cli import export_backbone
from locatdino.ssl.run import cli as fit_cli

ROOT = Path(__file__).resolve().parents[2]
BACKBONES = {"vit": "vit_tiny_patch16_224", "locatvit": "locatvit_tiny_patch8_224"}  # the recipes' --model.backbone
OBJECTIVES = ("dino", "ibot")
RECIPES = {"dino": "dino_tiny_cpu", "ibot": "ibot_tiny_cpu"}


def recipe_model(backbone: str, objective: str) -> tuple[Path, str, dict]:
    """Recipe file, backbone name and backbone kwargs of a (backbone, objective) pair."""
    path = ROOT / "configs" / f"{RECIPES[objective]}.yaml"
    model = yaml.safe_load(path.read_text())["model"]
    model = model.get("init_args", model)  # the iBOT recipe names its class
    return path, BACKBONES[backbone], dict(model.get("backbone_kwargs") or {})


def _rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _append(out: Path, row: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def train(backbone: str, objective: str, seed: int, steps: int, out: Path, extra: list[str]) -> tuple[Path, float]:
    recipe, name, _ = recipe_model(backbone, objective)
    run = out / backbone / objective / f"seed{seed}"
    argv = [
        "--config",
        str(recipe),
        "--model.backbone",
        name,
        "--seed_everything",
        str(seed),
        "--trainer.default_root_dir",
        str(run),
        "--data.init_args.train_urls",
        str(out / "scenes_shards"),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_steps",
        str(steps),
        "--trainer.max_epochs",
        "-1",
        *extra,
    ]
    start = time.perf_counter()
    if fit_cli.main(argv):
        raise SystemExit(f"ibot: locatdino fit {' '.join(argv)} failed")
    return run, time.perf_counter() - start


def run_study(args: argparse.Namespace) -> None:
    out = Path(args.out)
    train_set = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, args.input_size))
    val_set = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, args.input_size))
    for seed in args.seeds:
        for backbone in args.backbones:
            done = {(r["backbone"], r["objective"], r["seed"], r["steps"]) for r in _rows(out)}
            _, name, kwargs = recipe_model(backbone, "dino")
            if (backbone, "random", seed, 0) not in done:
                folder = out / "random" / backbone / f"seed{seed}"
                (folder / "confusions").mkdir(parents=True, exist_ok=True)
                torch.manual_seed(seed)  # the student both runs of this seed start from
                scores = score(
                    create_backbone(name, **kwargs),
                    train_set,
                    val_set,
                    args.input_size,
                    folder / "confusions",
                    "random",
                )
                _append(out, dict(backbone=backbone, objective="random", seed=seed, steps=0, run=str(folder), **scores))
            for objective in args.objectives:
                if (backbone, objective, seed, args.steps) in done:
                    print(f"ibot: {backbone} {objective} seed {seed} already in results.jsonl", flush=True)
                    continue
                run, seconds = train(backbone, objective, seed, args.steps, out, args.extra)
                exported = run / "backbone.pth"
                export_backbone(run / "checkpoints" / "last.ckpt", exported, overwrite=True)
                (run / "confusions").mkdir(exist_ok=True)
                scores = score(
                    create_backbone(name, exported, **kwargs),
                    train_set,
                    val_set,
                    args.input_size,
                    run / "confusions",
                    "trained",
                )
                row = dict(
                    backbone=backbone,
                    objective=objective,
                    seed=seed,
                    steps=args.steps,
                    fit_s=round(seconds, 1),
                    run=str(run),
                    extra=args.extra,
                    **scores,
                )
                _append(out, row)
                print(
                    f"| {backbone} | {objective} | {seed} | {row['fit_s']:.0f} | {row['hbird']:.2f} | "
                    f"{row['linprobe']:.2f} |",
                    flush=True,
                )


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def table(out: Path, steps: int) -> tuple[str, dict]:
    """Per (backbone, objective) mean ± std, then the paired differences against random init and
    iBOT − DINO, per seed with intervals, over seeds, and the seed-mean interval; and the numbers
    behind it (the runs, every interval)."""
    by = {}
    for r in _rows(out):
        if r["steps"] in (0, steps):
            by[(r["backbone"], r["objective"], r["seed"])] = r  # a rerun replaces its earlier line
    seeds = sorted({k[2] for k in by})
    lines = ["| backbone | objective | seeds | Hummingbird | linear probe | fit s |", "|---|---|---|---|---|---|"]
    for backbone in BACKBONES:
        for objective in ("random", *OBJECTIVES):
            rs = [by[(backbone, objective, s)] for s in seeds if (backbone, objective, s) in by]
            if rs:
                fit = _mean_std([r["fit_s"] for r in rs]) if objective != "random" else "—"
                lines.append(
                    f"| {backbone} | {objective} | {len(rs)} | {_mean_std([r['hbird'] for r in rs])} | "
                    f"{_mean_std([r['linprobe'] for r in rs])} | {fit} |"
                )
    lines += [
        "",
        "| paired difference | metric | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean ± std | seed-mean Δ [95 %] |",
        "|---|---|" + "---|" * (len(seeds) + 2),
    ]
    pairs = [(b, o, "trained", "random", "random") for b in BACKBONES for o in OBJECTIVES]
    pairs += [(b, "ibot", "trained", "dino", "trained") for b in BACKBONES]
    paired = {}
    for backbone, a, tag_a, b, tag_b in pairs:
        common = [s for s in seeds if (backbone, a, s) in by and (backbone, b, s) in by]
        if common:
            label = f"{backbone}: {a} − {b}"
            paired[label] = paired_intervals(
                [by[(backbone, a, s)] for s in common], tag_a, [by[(backbone, b, s)] for s in common], tag_b
            )
            lines += paired_rows(label, paired[label])
    return "\n".join(lines), {"steps": steps, "runs": list(by.values()), "paired": intervals_numbers(paired)}


def plot(out: Path, steps: int, path: Path) -> None:
    """Trained − random init per backbone, objective and metric: each seed's Δ (dots, with its
    interval over the query scenes) and the seed-mean Δ with its interval (bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["backbone"], r["objective"], r["seed"]): r for r in _rows(out) if r["steps"] in (0, steps)}
    seeds = sorted({k[2] for k in by})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, (protocol, title) in zip(axes, (("hbird", "Hummingbird"), ("linprobe", "linear probe"))):
        labels = []
        for y, (backbone, objective) in enumerate((b, o) for b in BACKBONES for o in OBJECTIVES):
            common = [s for s in seeds if (backbone, objective, s) in by and (backbone, "random", s) in by]
            a = [_confusions(by[(backbone, objective, s)], protocol, "trained") for s in common]
            b = [_confusions(by[(backbone, "random", s)], protocol, "random") for s in common]
            mean = seed_mean_miou_interval(a, b)
            ax.barh(y, mean.delta, height=0.8, color="tab:blue", alpha=0.3)
            ax.errorbar(
                mean.delta,
                y + 0.3,
                xerr=[[mean.delta - mean.low], [mean.high - mean.delta]],
                fmt="s",
                color="tab:blue",
                ms=4,
                lw=2,
                capsize=3,
            )
            for k, (x, z) in enumerate(zip(a, b)):
                iv = miou_interval(x, z)
                ax.errorbar(
                    iv.delta,
                    y - 0.25 + 0.15 * k,
                    xerr=[[iv.delta - iv.low], [iv.high - iv.delta]],
                    fmt="o",
                    color="k",
                    ms=3,
                    lw=0.8,
                )
            labels.append(f"{backbone} {objective}")
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(f"{title}: trained − random init (mIoU)")
        ax.set_yticks(range(len(labels)), labels)
    fig.suptitle(
        f"{steps} steps, seeds {', '.join(map(str, seeds))}: dots = seeds (95 % over query scenes), "
        "bar and blue square = seed mean (95 % over query scenes)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", nargs="+", choices=BACKBONES, default=list(BACKBONES))
    p.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=list(OBJECTIVES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=80, help="optimizer steps of every run (the same budget)")
    p.add_argument("--input-size", type=int, default=128, help="Hummingbird eval px (the demo's)")
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--out", default="runs/bench_ibot")
    p.add_argument(
        "--table",
        action="store_true",
        help="print the table of <out>/results.jsonl, write its numbers to --results, and stop",
    )
    add_results_option(p, "ibot.json")
    p.add_argument("--figure", type=Path, default=None, help="with --table: also draw the differences to this PNG")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more fit flags, on every run (logged)")
    args = p.parse_args()
    if args.table:  # the only mode that writes --results
        args.results = results_file(args, "ibot.json")
        markdown, numbers = table(Path(args.out), args.steps)
        print(markdown)
        write_results(args.results, "ibot.json", numbers)
        if args.figure:
            plot(Path(args.out), args.steps, args.figure)
        return
    torch.set_num_threads(2)
    print("| backbone | objective | seed | fit s | Hummingbird | linear probe |\n|---|---|---|---|---|---|", flush=True)
    run_study(args)


if __name__ == "__main__":
    main()
