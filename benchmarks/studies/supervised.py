"""Does LocAtViT help when the network is trained to classify? The paper's experiment on the scenes.

LocAtViT's headline result (docs/locatvit.md, docs/pretraining.md) is for ViTs trained supervised
and evaluated frozen for segmentation, with GAug-only and PRR-only ablations. This trains the four
tiny variants with the same recipe and budget (``configs/sup_tiny_cpu.yaml``, backbone switched with
``--model.backbone``: timm's recipe lightened for a minute, image-level scene labels, the same
number of optimizer steps and scenes) for each seed, exports each backbone
(``<out>/<setting>/<variant>/seed<S>/backbone.pth``, loadable by ``locatdino hbird``/``compare``
without retraining), and scores it frozen:

- Hummingbird mIoU on held-out scenes (100 memory / 50 query images at 128 px, the demo's
  protocol, fp32, exact search) and the frozen dense linear probe (docs/evaluation.md, the cheap cached
  variant ``locatdino compare`` runs: 320 iterations of batch 8 on the memory scenes' tokens,
  scored on the same query scenes), each also for the same network at random initialisation (the
  network the run starts from: the positive control, supervised must be clearly above it);
- held-out top-1 (the run's last ``val/top1``, 128 val scenes).

Variants: ``vit`` (ViT-T/8), ``locatvit`` (GAug + PRR), ``gaug_only`` (LocAtViT with timm's class
token pooling, ``global_pool='token'``), ``prr_only`` (ViT with ``global_pool='prr'``). Every run
appends one JSON line to ``<out>/results.jsonl`` and keeps its per-query-image confusion matrices
(``<run>/confusions/{hbird,linprobe}_{trained,random}.npz``); ``--table`` prints per-variant
mean ± std, then each variant's paired Δ against ViT and trained − random: per seed, mean ± std
over seeds, and the 95 % paired-bootstrap interval of the seed-mean Δ over the query scenes
(docs/evaluation.md; ``locatdino.evaluation.bootstrap.seed_mean_miou_interval``).

``--every N`` also keeps a checkpoint every N steps and scores each with Hummingbird (how the
features move during the run); ``--backbone-kwargs`` changes every variant's backbone (e.g. timm's
``global_pool='avg'``, with ``--variants vit``).

    python -m benchmarks.studies.supervised --seeds 0 1 2 3 4 --steps 96
    python -m benchmarks.studies.supervised --table --steps 96
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import yaml

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.evaluation.bootstrap import miou_interval, seed_mean_miou_interval
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig, hummingbird
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, linear_probe
from locatdino.evaluation.splits import CachedSplit, open_split
from locatdino.models import create_backbone
from locatdino.ssl.export.cli import export_backbone
from locatdino.ssl.logs.curves import stitched_metrics

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "sup_tiny_cpu"
# variant -> (the recipe's --model.backbone, backbone_kwargs added to the recipe's)
VARIANTS: dict[str, tuple[str, dict]] = {
    "vit": ("vit_tiny_patch16_224", {}),
    "locatvit": ("locatvit_tiny_patch8_224", {}),
    "gaug_only": ("locatvit_tiny_patch8_224", {"global_pool": "token"}),
    "prr_only": ("vit_tiny_patch16_224", {"global_pool": "prr"}),
}
# label setting -> flags on top of the recipe
LABELS: dict[str, list[str]] = {
    "cls": [],
    "multi": [
        "--data.init_args.labels",
        "classes.json",
        "--model.init_args.bce_loss",
        "true",
        "--model.init_args.mixup_alpha",
        "0",
        "--model.init_args.cutmix_alpha",
        "0",
    ],
}


def recipe_of(variant: str, more: dict | None = None) -> tuple[Path, str, dict]:
    """The recipe file, backbone name and backbone kwargs of a variant (``more`` on top)."""
    name, extra = VARIANTS[variant]
    path = ROOT / "configs" / f"{RECIPE}.yaml"
    model = yaml.safe_load(path.read_text())["model"]["init_args"]
    return path, name, {**model["backbone_kwargs"], **extra, **(more or {})}


def train(
    variant: str, seed: int, steps: int, labels: str, out: Path, extra: list[str], more: dict, every: int | None
) -> tuple[Path, float]:
    """One supervised run; its folder and wall seconds. The shards are shared by every run.
    ``every``: also keep a checkpoint every that many steps (``<run>/checkpoints/s<step>.ckpt``)."""
    recipe, name, kwargs = recipe_of(variant, more)
    setting = labels + "".join("+" + a.lstrip("-").split(".")[-1] for a in extra[::2])
    setting += "".join(f"+{k}={v}" for k, v in more.items())
    run = out / setting / variant / f"seed{seed}"
    if every:
        extra = [
            *extra,
            "--step_checkpoint.every_n_train_steps",
            str(every),
            "--step_checkpoint.save_top_k",
            "-1",
            "--step_checkpoint.filename",
            "s{step}",
        ]
    argv = [
        "--config",
        str(recipe),
        "--seed_everything",
        str(seed),
        "--trainer.default_root_dir",
        str(run),
        "--data.init_args.train_urls",
        str(out / "scenes" / "train"),
        "--data.init_args.val_urls",
        str(out / "scenes" / "val"),
        "--model.init_args.backbone",
        name,
        "--model.init_args.backbone_kwargs",
        json.dumps(kwargs),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_steps",
        str(steps),
        "--trainer.max_epochs",
        "-1",
        *LABELS[labels],
        *extra,
    ]
    from locatdino.ssl.run import cli as fit_cli  # here: gpu_study.py imports score() where jsonargparse is missing

    start = time.perf_counter()
    if fit_cli.main(argv):
        raise SystemExit(f"supervised: locatdino fit {' '.join(argv)} failed")
    return run, time.perf_counter() - start


def _hbird(model: torch.nn.Module, train_set, val_set, input_size: int):
    return hummingbird(
        model.eval(),
        train_set,
        val_set,
        HummingbirdConfig(input_size=input_size, batch_size=32, progress=False, num_workers=0, precision="fp32"),
    )


def score(model: torch.nn.Module, train_set, val_set, input_size: int, folder: Path, tag: str) -> dict[str, float]:
    """Hummingbird and linear-probe mIoU of a frozen backbone (fp32); per-image matrices to ``folder``."""
    hb = _hbird(model, train_set, val_set, input_size)
    lp = linear_probe(
        model,
        train_set,
        val_set,
        LinearProbeConfig(
            input_size=input_size,
            iterations=320,
            batch_size=8,
            augment="off",
            precision="fp32",
            num_workers=0,
            progress=False,
        ),
    )
    hb.image_confusions.save(folder / f"hbird_{tag}.npz")
    lp.image_confusions.save(folder / f"linprobe_{tag}.npz")
    return {"hbird": round(hb.miou, 2), "linprobe": round(lp.miou, 2)}


def evaluate(args: argparse.Namespace) -> None:
    train_set = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, args.input_size))
    val_set = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, args.input_size))
    out = Path(args.out)
    for seed in args.seeds:
        for variant in args.variants:
            run, seconds = train(
                variant, seed, args.steps, args.labels, out, args.extra, args.backbone_kwargs, args.every
            )
            exported = run / "backbone.pth"
            export_backbone(run / "checkpoints" / "last.ckpt", exported, overwrite=True)  # this run's own, redone
            _, name, kwargs = recipe_of(variant, args.backbone_kwargs)
            torch.manual_seed(seed)
            random = create_backbone(name, **kwargs)
            trained = create_backbone(name, exported, **kwargs)
            (run / "confusions").mkdir(exist_ok=True)
            scores = {
                k + suffix: v
                for model, tag, suffix in ((trained, "trained", ""), (random, "random", "_random"))
                for k, v in score(model, train_set, val_set, args.input_size, run / "confusions", tag).items()
            }
            metrics = stitched_metrics(run / "logs")
            trajectory = {}  # Hummingbird of each kept step checkpoint (--every)
            for ckpt in sorted((run / "checkpoints").glob("s*.ckpt"), key=lambda f: int(f.stem.split("=")[-1])):
                export_backbone(ckpt, run / "checkpoints" / f"{ckpt.stem}.pth", overwrite=True)
                model = create_backbone(name, run / "checkpoints" / f"{ckpt.stem}.pth", **kwargs)
                trajectory[int(ckpt.stem.split("=")[-1])] = round(
                    _hbird(model, train_set, val_set, args.input_size).miou, 2
                )
            row = dict(
                variant=variant,
                labels=args.labels,
                extra=args.extra,
                more=args.backbone_kwargs,
                seed=seed,
                steps=args.steps,
                fit_s=round(seconds, 1),
                **scores,
                hbird_steps=trajectory,
                top1_steps=[(step, round(v, 1)) for step, v in metrics["val/top1"]],
                top1=round(metrics["val/top1"][-1][1], 1),
                backbone=str(exported),
                run=str(run),
                backbone_kwargs=kwargs,
                name=name,
            )
            with open(out / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"| {variant} | {seed} | {row['fit_s']:.0f} | {row['hbird']:.1f} | {row['hbird_random']:.1f} | "
                f"{row['linprobe']:.1f} | {row['linprobe_random']:.1f} | {row['top1']:.1f} |",
                flush=True,
            )


def precision_check(args: argparse.Namespace) -> None:
    """``--precision auto`` (and int8, bf16 forced) against fp32 on the trained backbones of
    ``results.jsonl`` (the check benchmarks/speed/hbird.py made on random-init weights; bound ±0.1 mIoU)."""
    train_set = CachedSplit(open_split("scenes", None, "train", args.num_train, 0, args.input_size))
    val_set = CachedSplit(open_split("scenes", None, "val", args.num_val, 0, args.input_size))
    rows = [json.loads(line) for line in (Path(args.out) / "results.jsonl").read_text().splitlines() if line.strip()]
    print("| variant | seed | fp32 | auto (ran as) | int8 | bf16 | max abs Δ |\n|---|---|---|---|---|---|---|")
    for row in rows:
        if row["seed"] not in args.seeds or row["variant"] not in args.variants or row["labels"] != args.labels:
            continue
        scores, ran = {}, ""
        for precision in ("fp32", "auto", "int8", "bf16"):
            model = create_backbone(row["name"], row["backbone"], **row["backbone_kwargs"]).eval()  # fresh each time
            cfg = HummingbirdConfig(
                input_size=args.input_size, batch_size=32, progress=False, num_workers=0, precision=precision
            )
            result = hummingbird(model, train_set, val_set, cfg)
            scores[precision] = result.miou
            ran = result.search.get("precision", ran) if precision == "auto" else ran
        worst = max(abs(scores[p] - scores["fp32"]) for p in ("auto", "int8", "bf16"))
        print(
            f"| {row['variant']} | {row['seed']} | {scores['fp32']:.2f} | {scores['auto']:.2f} ({ran}) | "
            f"{scores['int8']:.2f} | {scores['bf16']:.2f} | {worst:.2f} |",
            flush=True,
        )


def _mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:+.1f}"
    return f"{statistics.mean(values):+.1f} ± {statistics.stdev(values):.1f}"


def _mark(interval) -> str:
    """``+1.2 [+0.4, +2.0] ✓``: the tick when the interval excludes 0 (docs/evaluation.md)."""
    return interval.text(1) + ("" if interval.covers_zero else " ✓")


def _confusions(row: dict, protocol: str, tag: str) -> ImageConfusions:
    return ImageConfusions.load(Path(row["run"]) / "confusions" / f"{protocol}_{tag}.npz")


def table(out: Path, labels: str, steps: int, extra: list[str], more: dict) -> tuple[str, dict]:
    """Markdown from ``results.jsonl``: per variant mean ± std, then paired differences (per seed,
    mean ± std over seeds, and the bootstrap interval of the seed-mean difference) for each variant
    against ViT and for each variant's trained network against its random init; and the numbers
    behind it (the runs, every interval)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [
        r
        for r in rows
        if r["labels"] == labels and r["steps"] == steps and r.get("extra", []) == extra and r.get("more", {}) == more
    ]
    by = {(r["variant"], r["seed"]): r for r in rows}  # a rerun replaces its earlier line
    variants = [v for v in VARIANTS if any(k[0] == v for k in by)]
    seeds = sorted({s for _, s in by})
    lines = [
        "| variant | seeds | Hummingbird | random init | linear probe | random init | held-out top-1 | fit s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        rs = [by[(v, s)] for s in seeds if (v, s) in by]

        def ms(key: str, rs: list[dict] = rs) -> str:
            return _mean_std([r[key] for r in rs]).lstrip("+")

        lines.append(
            f"| {v} | {len(rs)} | {ms('hbird')} | {ms('hbird_random')} | {ms('linprobe')} | "
            f"{ms('linprobe_random')} | {ms('top1')} | {ms('fit_s')} |"
        )
    lines += [
        "",
        "| paired difference | metric | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean ± std | seed-mean Δ [95 %] |",
        "|---|---|" + "---|" * (len(seeds) + 2),
    ]
    pairs = [(f"{v} − random init", v, "trained", v, "random") for v in variants]
    pairs += [(f"{v} − vit", v, "trained", "vit", "trained") for v in variants[1:]]
    paired = {}
    for label, va, ta, vb, tb in pairs:
        common = [s for s in seeds if (va, s) in by and (vb, s) in by]
        paired[label] = paired_intervals([by[(va, s)] for s in common], ta, [by[(vb, s)] for s in common], tb)
        lines += paired_rows(label, paired[label])
    return "\n".join(lines), {"runs": list(by.values()), "paired": intervals_numbers(paired)}


PROTOCOLS = (("hbird", "Hummingbird"), ("linprobe", "linear probe"))


def paired_intervals(rows_a: list[dict], tag_a: str, rows_b: list[dict], tag_b: str) -> dict[str, dict]:
    """Per protocol, the paired difference A − B over seeds (``rows_a[i]`` and ``rows_b[i]`` of the
    same seed; ``tag``: which saved confusions, ``trained`` or ``random``): each seed's interval
    (``per_seed``) and the interval of the seed-mean Δ (``seed_mean``)."""
    intervals = {}
    for protocol, _ in PROTOCOLS:
        a = [_confusions(r, protocol, tag_a) for r in rows_a]
        b = [_confusions(r, protocol, tag_b) for r in rows_b]
        intervals[protocol] = {
            "seeds": [r["seed"] for r in rows_a],
            "per_seed": [miou_interval(x, y) for x, y in zip(a, b)],
            "seed_mean": seed_mean_miou_interval(a, b),
        }
    return intervals


def paired_rows(label: str, intervals: dict[str, dict]) -> list[str]:
    """One table row per protocol of :func:`paired_intervals`: per seed with its interval, mean ±
    std over seeds, and the interval of the seed-mean Δ."""
    return [
        f"| {label} | {name} | " + " | ".join(_mark(i) for i in intervals[protocol]["per_seed"]) + " | "
        f"{_mean_std([i.delta for i in intervals[protocol]['per_seed']])} | "
        f"{_mark(intervals[protocol]['seed_mean'])} |"
        for protocol, name in PROTOCOLS
    ]


def intervals_numbers(paired: dict[str, dict[str, dict]]) -> dict:
    """:func:`paired_intervals` per label, as JSON (each interval's ``to_dict``)."""
    return {
        label: {
            protocol: {
                "seeds": v["seeds"],
                "per_seed": [i.to_dict() for i in v["per_seed"]],
                "seed_mean": v["seed_mean"].to_dict(),
            }
            for protocol, v in protocols.items()
        }
        for label, protocols in paired.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=64, help="optimizer steps of every run (the same budget)")
    p.add_argument(
        "--labels",
        choices=sorted(LABELS),
        default="cls",
        help="cls: dominant object class, softmax + Mixup/CutMix; multi: every class above the "
        "shards' share, BCE without mixing",
    )
    p.add_argument("--input-size", type=int, default=128, help="Hummingbird eval px (the demo's)")
    p.add_argument("--num-train", type=int, default=100)
    p.add_argument("--num-val", type=int, default=50)
    p.add_argument("--out", default="runs/bench_supervised")
    p.add_argument(
        "--backbone-kwargs",
        type=json.loads,
        default={},
        help='JSON added to every variant\'s backbone kwargs, e.g. \'{"global_pool": "avg"}\'',
    )
    p.add_argument(
        "--every",
        type=int,
        default=None,
        help="also keep a checkpoint every N steps and score each with Hummingbird (the trajectory)",
    )
    p.add_argument(
        "--table",
        action="store_true",
        help="print the table of <out>/results.jsonl, write its numbers to --results, and stop",
    )
    add_results_option(p, "supervised.json")
    p.add_argument(
        "--precision-check",
        action="store_true",
        help="score the trained backbones of <out>/results.jsonl (--seeds, --variants) at "
        "--precision auto, int8 and bf16 against fp32 instead of training",
    )
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more fit flags, on every run (logged)")
    args = p.parse_args()
    if args.table:  # the only mode that writes --results
        args.results = results_file(args, "supervised.json")
        markdown, numbers = table(Path(args.out), args.labels, args.steps, args.extra, args.backbone_kwargs)
        print(markdown)
        write_results(args.results, "supervised.json", numbers)
        return
    torch.set_num_threads(2)
    if args.precision_check:
        precision_check(args)
        return
    print(
        "| variant | seed | fit s | Hummingbird | random init | linear probe | random init | top-1 |\n"
        "|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    evaluate(args)


if __name__ == "__main__":
    main()
