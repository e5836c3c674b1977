"""Vanilla DINO vs DINO-LocAtViT over seeds: the demo's comparison, repeated, with mean ± std.

Runs ``locatdino demo --seed S`` (a fresh output folder per seed, so every run is cold: shards
written, both backbones pretrained, four models compared) for each seed, times each run, and
prints markdown tables for ``benchmarks/RESULTS.md``: Hummingbird mIoU, Hungarian mIoU and the
class-token probes of the four models (ViT / LocAtViT, DINO teacher / random init) as mean ±
std over seeds, the paired differences LocAtViT − ViT and teacher − random init as mean ± std,
and each seed's paired differences with their 95 % paired-bootstrap intervals over the query
(test) images (docs/evaluation.md; ``locatdino.evaluation.compare.intervals``), with the time the bootstrap adds
to each compare. The figures of the first seed are copied to ``--figures`` (small PNGs to commit
next to the tables).

    python -m benchmarks.studies.compare --quick
    python -m benchmarks.studies.compare --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.evaluation.bootstrap import RESAMPLES, SEED
from locatdino.evaluation.compare.intervals import attach_differences, model_differences

MODELS = ("vit-dino", "locatvit-dino", "vit-random", "locatvit-random")
METRICS = (
    ("mIoU", lambda m: m["hbird"]["miou"]),
    ("mIoU Hungarian", lambda m: m["hbird"]["miou_matched"]),
    ("k-NN top-1", lambda m: m["probes"]["knn_top1"]),
    ("logistic top-1", lambda m: m["probes"]["logistic_top1"]),
)
PAIRS = (
    ("locatvit-dino", "vit-dino"),
    ("locatvit-random", "vit-random"),
    ("vit-dino", "vit-random"),
    ("locatvit-dino", "locatvit-random"),
)


def run_demo(seed: int, out: Path, quick: bool) -> tuple[dict, float]:
    """One cold demo run; its report and wall time in seconds."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "locatdino", "demo", "--seed", str(seed), "--out", str(out)] + (
        ["--quick"] if quick else []
    )
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    return json.loads((out / "compare" / "results.json").read_text()), seconds


def _mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values, ddof=1):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def table(reports: list[dict]) -> str:
    """Markdown: mean ± std (sample std over seeds) per model and metric, then paired differences."""
    by_seed = [{m["spec"]["name"]: m for m in r["models"]} for r in reports]
    rows = ["| model | " + " | ".join(name for name, _ in METRICS) + " |", "|" + "---|" * (len(METRICS) + 1)]
    for model in MODELS:
        rows.append(
            f"| {model} | " + " | ".join(_mean_std([get(s[model]) for s in by_seed]) for _, get in METRICS) + " |"
        )
    rows += [
        "",
        "| paired difference | " + " | ".join(name for name, _ in METRICS) + " |",
        "|" + "---|" * (len(METRICS) + 1),
    ]
    for a, b in PAIRS:
        rows.append(
            f"| {a} − {b} | "
            + " | ".join(_mean_std([get(s[a]) - get(s[b]) for s in by_seed]) for _, get in METRICS)
            + " |"
        )
    return "\n".join(rows)


INTERVAL_METRICS = (("mIoU", "miou"), ("k-NN top-1", "knn_top1"), ("logistic top-1", "logistic_top1"))


def seed_intervals(reports: list[dict], folders: list[Path]) -> dict[tuple[str, str, str], list]:
    """Each seed's paired difference with its 95 % interval, per (pair, metric), seeds in order."""
    intervals: dict[tuple[str, str, str], list] = {}
    for report, folder in zip(reports, folders):
        by_name = {m["spec"]["name"]: m for m in report["models"]}
        for a, b in PAIRS:
            for metric, interval in model_differences(by_name[a], by_name[b], folder).items():
                intervals.setdefault((a, b, metric), []).append(interval)
    return intervals


def per_seed_table(intervals: dict[tuple[str, str, str], list], seeds: list[int]) -> str:
    """Markdown: each seed's paired difference and its 95 % interval, per pair and metric."""
    rows = [
        "| paired difference | metric | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|" + "---|" * (len(seeds) + 2),
    ]
    for a, b in PAIRS:
        for name, metric in INTERVAL_METRICS:
            if (a, b, metric) in intervals:
                rows.append(
                    f"| {a} − {b} | {name} | "
                    + " | ".join(i.text(1) + (" ✓" if not i.covers_zero else "") for i in intervals[(a, b, metric)])
                    + " |"
                )
    return "\n".join(rows)


def bootstrap_seconds(report: dict, folder: Path) -> float:
    """Wall time of the intervals ``locatdino compare`` attaches (every model against the first)."""
    models = json.loads(json.dumps(report["models"]))
    start = time.perf_counter()
    attach_differences(models, folder)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--quick", action="store_true", help="the demo's --quick budget")
    p.add_argument("--out", default="runs/bench_compare")
    p.add_argument("--figures", default="benchmarks/figures/compare", help="where the first seed's figures go")
    add_results_option(p, "compare.json")
    args = p.parse_args()
    args.results = results_file(args, "compare.json")  # before any measuring
    reports, seconds = [], []
    for seed in args.seeds:
        report, wall = run_demo(seed, Path(args.out) / f"seed{seed}", args.quick)
        reports.append(report)
        seconds.append(wall)
        print(f"seed {seed}: demo{' --quick' if args.quick else ''} {wall / 60:.1f} min", file=sys.stderr, flush=True)
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    first = Path(args.out) / f"seed{args.seeds[0]}" / "compare"
    for name in reports[0]["figures"].values():
        shutil.copy(first / name, figures / Path(name).name)
    cfg = reports[0]["config"]
    print(
        f"{len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}), demo{' --quick' if args.quick else ''}: "
        f"{reports[0]['dataset']['num_train']} memory / {reports[0]['dataset']['num_val']} query scenes at "
        f"{cfg['input_size']} px; wall time per demo run {min(seconds) / 60:.1f}–{max(seconds) / 60:.1f} min\n"
    )
    print(table(reports))
    folders = [Path(args.out) / f"seed{seed}" / "compare" for seed in args.seeds]
    print(
        f"\nPer seed, with 95 % paired-bootstrap intervals ({RESAMPLES:,} resamples of the query / test images, "
        f"seed {SEED}; ✓: the interval excludes 0):\n"
    )
    intervals = seed_intervals(reports, folders)
    print(per_seed_table(intervals, args.seeds))
    boot = [bootstrap_seconds(r, f) for r, f in zip(reports, folders)]
    by_seed = [{m["spec"]["name"]: m for m in r["models"]} for r in reports]
    write_results(
        args.results,
        "compare.json",
        {
            "seeds": args.seeds,
            "demo_minutes": [s / 60 for s in seconds],
            "bootstrap_s": boot,
            "per_seed": {model: {name: [get(s[model]) for s in by_seed] for name, get in METRICS} for model in MODELS},
            "paired_intervals": [
                {"a": a, "b": b, "metric": metric, "seed": seed, **i.to_dict()}
                for (a, b, metric), per_seed in intervals.items()
                for seed, i in zip(args.seeds, per_seed)
            ],
        },
    )
    print(f"\nbootstrap of the three Δ of a compare (files read included): {min(boot):.2f}–{max(boot):.2f} s")
    print(f"\nfigures of seed {args.seeds[0]}: {figures}")


if __name__ == "__main__":
    main()
