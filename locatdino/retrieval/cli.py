"""``locatdino hbird``: the Hummingbird benchmark from the command line.

    locatdino hbird --model vit_small_patch16_224 --checkpoint dino_vits16.pth \\
        --model locatvit_small --checkpoint last.ckpt --dataset voc --data-dir VOCdevkit/VOC2012
    locatdino hbird report runs/a runs/b --out comparison.md

Several ``--model`` (each with its ``--checkpoint``, ``none`` for random init) are evaluated on
the same memory views and compared in one report. One model writes ``OUT/results.json`` and
``OUT/summary.md``; several write ``OUT/<model>/...`` per run plus ``OUT/summary.md`` comparing
them. ``report`` rebuilds a comparison from existing ``results.json`` files.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import fields
from pathlib import Path
from locatdino.retrieval.augment import AUGMENT_MODES
from locatdino.retrieval.evaluate import HummingbirdConfig, hummingbird
from locatdino.retrieval.metric import HUNGARIAN_CRITERIA
from locatdino.retrieval.provenance import checkpoint_record
from locatdino.retrieval.report import atomic_write_text, load_results, results_table, summary_markdown, write_run
from locatdino.retrieval.splits import open_split

DATASETS = ("scenes", "voc", "ade20k", "shards")


def _parser() -> argparse.ArgumentParser:
    d = HummingbirdConfig()
    p = argparse.ArgumentParser(
        prog="locatdino hbird",
        description="Hummingbird in-context segmentation: label each query patch from its k nearest "
        "labelled memory patches (frozen encoder, FAISS k-NN), report mIoU. "
        "`locatdino hbird report RESULTS...` compares finished runs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", action="append", required=True, metavar="NAME",
                   help="timm / LocAtViT model name; repeat to compare several models")
    p.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                   help="weights for the matching --model ('none': random init); any format of "
                   "locatdino.models.create_backbone")
    p.add_argument("--dataset", choices=DATASETS, default="scenes", help="labelled dataset")
    p.add_argument("--data-dir", default=None, help="dataset root (shard URL pattern for 'shards'); "
                   "not needed for the built-in scenes")
    p.add_argument("--train-split", default="train", help="memory split (VOC: trainaug as in the paper)")
    p.add_argument("--val-split", default="val", help="query split")
    p.add_argument("--num-train", type=int, default=None,
                   help="memory images: a seeded random subset (scenes: how many to render, default 300)")
    p.add_argument("--num-val", type=int, default=None, help="query images (scenes default 100)")
    p.add_argument("--scene-size", type=int, default=224, help="side of the built-in scenes in px")
    p.add_argument("--memory-size", type=int, default=None, metavar="M",
                   help="memory budget in patches (rare-class-first sampling); default: keep all")
    p.add_argument("--aug-epochs", type=int, default=d.aug_epochs, help="augmented passes over the memory images")
    p.add_argument("--k", type=int, default=d.k, help="neighbours per query patch")
    p.add_argument("--beta", type=float, default=d.beta, help="softmax temperature of the neighbour weights")
    p.add_argument("--index", default=d.index, metavar="SPEC",
                   help="FAISS factory string: Flat (exact), IVF1024,Flat, IVF1024,PQ48, HNSW32, ...")
    p.add_argument("--nprobe", type=int, default=None, help="IVF cells visited per query")
    p.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    p.add_argument("--index-device", choices=("auto", "cpu", "gpu"), default=d.index_device,
                   help="auto: a GPU index when faiss-gpu sees a GPU")
    p.add_argument("--input-size", type=int, default=d.input_size, metavar="S", help="eval resolution (paper: 512)")
    p.add_argument("--augment", choices=AUGMENT_MODES, default=d.augment,
                   help="memory views: zoom-out (crops of --scale, above 1 zooming out, + colour jitter), "
                   "reference (the reference's sampler, torchvision's RandomResizedCrop: draws above 1 "
                   "rejected, whole-image fallback, + colour jitter) or off (whole images, no jitter)")
    p.add_argument("--scale", type=float, nargs=2, default=d.scale, metavar=("MIN", "MAX"),
                   help="memory crop area / image area; above 1 zooms out (the reference's sampler "
                   "rejects those draws: '--scale 0.5 1' matches its effective range)")
    p.add_argument("--layer", type=int, default=d.layer, help="block whose patch tokens are used")
    p.add_argument("--norm", action=argparse.BooleanOptionalAction, default=d.norm,
                   help="apply the final norm to the features (the reference's default wrapper does "
                   "for timm models: it takes forward_features)")
    p.add_argument("--prr", action="store_true", help="apply PRR to the features")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=d.precision,
                   help="encoder precision (bf16 autocast: ~2x faster with native bf16 (AVX512-BF16, AMX, GPUs), several times slower on AVX2-only CPUs)")
    p.add_argument("--memory-dtype", choices=("float32", "float16"), default=d.memory_dtype,
                   help="stored features (memory-dir banks, non-Flat indices)")
    p.add_argument("--memory-dir", default=None, help="memory-map the memory bank into this directory")
    p.add_argument("--hungarian", choices=HUNGARIAN_CRITERIA, default=d.hungarian,
                   help="criterion of the Hungarian-matched mIoU: iou (summed IoU, the reference's) "
                   "or pixels (summed matched pixels)")
    p.add_argument("--eval-resolution", choices=("original", "input"), default=d.eval_resolution,
                   help="score at the masks' original resolution, or at the input size (reference)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="images per forward")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers (default: 1 for a CPU encoder, min(8, cores) on GPU)")
    p.add_argument("--seed", type=int, default=d.seed, help="memory views, subsets, sampling, random init")
    p.add_argument("--out", default="hbird_results", metavar="DIR", help="results.json + summary.md")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="locatdino hbird report",
                                description="Compare finished Hummingbird runs.")
    p.add_argument("results", nargs="+", help="results.json files or directories holding them")
    p.add_argument("--out", default=None, help="also write the markdown comparison here")
    return p


def _runs(args: argparse.Namespace) -> list[tuple[str, str | None, str]]:
    """(model, checkpoint, label) per run, labels unique and usable as directory names."""
    ckpts = args.checkpoint or [None] * len(args.model)
    if len(ckpts) != len(args.model):
        raise SystemExit(
            f"locatdino hbird: {len(args.model)} --model but {len(args.checkpoint)} --checkpoint "
            "(give one per model, 'none' for random init)"
        )
    runs, seen = [], set()
    for name, ckpt in zip(args.model, ckpts):
        ckpt = None if ckpt in (None, "", "none") else ckpt
        label = name if ckpt is None else f"{name}-{Path(ckpt).stem}"
        label = re.sub(r"[^\w.+-]+", "_", label)
        base, i = label, 1
        while label in seen:
            i += 1
            label = f"{base}-{i}"
        seen.add(label)
        runs.append((name, ckpt, label))
    return runs


def _config(args: argparse.Namespace, memory_dir: str | None) -> HummingbirdConfig:
    names = {f.name for f in fields(HummingbirdConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and k != "memory_dir"}
    return HummingbirdConfig(
        **values, num_workers=args.workers, memory_dir=memory_dir, progress=not args.no_progress
    )


def report_main(argv: list[str]) -> int:
    args = _report_parser().parse_args(argv)
    results = load_results(args.results)
    print(results_table(results))
    if args.out:
        atomic_write_text(args.out, summary_markdown(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    args = _parser().parse_args(argv)
    import torch

    from locatdino.retrieval.features import load_backbone

    runs = _runs(args)
    try:
        _config(args, None)  # inconsistent settings fail before any data is read
        common = dict(seed=args.seed, scene_size=args.scene_size)
        train_set = open_split(args.dataset, args.data_dir, args.train_split, args.num_train,
                               default_scenes=300, **common)
        val_set = open_split(args.dataset, args.data_dir, args.val_split, args.num_val,
                             default_scenes=100, **common)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino hbird: {err}") from None
    out = Path(args.out)
    results = []
    for name, ckpt, label in runs:
        single = len(runs) == 1
        memory_dir = None if args.memory_dir is None else str(Path(args.memory_dir) / ("" if single else label))
        cfg = _config(args, memory_dir)
        print(f"[hbird] {label}: memory {len(train_set)} images x {cfg.aug_epochs} views, "
              f"{len(val_set)} queries, {cfg.input_size} px, index {cfg.index}", file=sys.stderr)
        if ckpt is None:
            torch.manual_seed(args.seed)  # a random-init run is reproducible from --seed
        result = hummingbird(load_backbone(name, ckpt), train_set, val_set, cfg).to_dict()
        result["model"] = {"name": name, "checkpoint": ckpt, "label": label}
        result["config"].update(dataset=args.dataset, data_dir=args.data_dir)
        result["provenance"]["checkpoint"] = checkpoint_record(ckpt)
        write_run(result, out if single else out / label)
        results.append(result)
    if len(results) > 1:
        atomic_write_text(out / "summary.md", summary_markdown(results, "Hummingbird comparison"))
    print(results_table(results))
    print(f"[hbird] results written to {out}", file=sys.stderr)
    return 0
