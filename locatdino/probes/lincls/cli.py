"""``locatdino lincls``: linear classification on frozen class tokens (docs/evaluation.md).

    locatdino lincls --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --dataset imagefolder --data-dir data/imagenet --out runs/lincls-in1k
    locatdino lincls --protocol fast --model ... --out runs/lincls-fast

``--protocol full`` is DINO's ``eval_linear`` (augmented views through the backbone every epoch);
``fast`` DINOv2's grid of learning rates on cached features (``locatdino.probes.lincls.protocol``).
Not the dense ``linprobe``, which trains a segmentation head on patch tokens. Several
``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) run one after another on the same
images, the first the reference of every Δ. ``OUT/results.json`` holds, per model, top-1 and
top-5 with 95 % Wilson intervals over the validation images and the Δ top-1 to the first model
with its paired-bootstrap interval; ``OUT/report.md`` the same as tables. Results already there
are kept unless ``--overwrite`` (checked before any work).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from locatdino.arguments import ArgumentParser, ConfigTable, at_least, option_groups, positive_float
from locatdino.evaluation.bootstrap import accuracy_interval
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import add_data_arguments, add_loader_arguments, encoder_device, record_run
from locatdino.evaluation.precision import PRECISIONS
from locatdino.help_format import DefaultsOnceHelpFormatter
from locatdino.output_files import (DiskFullError, atomic_write_text, ensure_writable, output_lock,
                                    remove_stale_temporaries)
from locatdino.probes.class_splits import CLASS_DATASETS, LabelledImages, align_classes, open_class_split
from locatdino.probes.lincls.features import LinearInput
from locatdino.probes.lincls.protocol import EPOCHS, PROTOCOLS, LinclsConfig, linear_classification
from locatdino.probes.lincls.report import LINCLS_FILES, lincls_report, lincls_table

LINCLS_TABLE = ConfigTable(
    LinclsConfig,
    options={"--protocol": "protocol", "--input-size": "input_size", "--epochs": "epochs",
             "--batch-size": "batch_size", "--lr": "lr", "--lr-grid": "lr_grid", "--holdout": "holdout",
             "--last-blocks": "last_blocks", "--avgpool": "avgpool", "--prr": "prr", "--precision": "precision",
             "--eval-batch-size": "eval_batch_size", "--cache-dir": "cache_dir", "--cache-ram-mb": "max_cache_ram_mb",
             "--workers": "num_workers", "--seed": "seed", "--no-progress": "progress"},
    internal={},
    negated=frozenset({"--no-progress"}),
)


def _holdout(text: str) -> float:
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return value


def _parser() -> ArgumentParser:
    d = LinclsConfig()
    p = ArgumentParser(
        prog="locatdino lincls",
        description="Linear classification on frozen class tokens (DINO's eval_linear; --protocol fast: DINOv2's "
        "lr grid on cached features): top-1 / top-5 on the validation images. Not the dense linprobe.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model)
    add_data_arguments(groups.data, CLASS_DATASETS)
    protocol, runtime = groups.protocol, groups.runtime
    protocol.add_argument("--protocol", choices=PROTOCOLS, default=d.protocol,
                          help="full: DINO's eval_linear (RandomResizedCrop + flip views through the backbone every "
                          "epoch); fast: DINOv2's grid of learning rates trained at once on cached centre-crop "
                          "features, the best picked on --holdout")
    protocol.add_argument("--input-size", type=at_least(1), default=d.input_size, metavar="S",
                          help="crop side; evaluation resizes the short side to S x 256 / 224 first")
    protocol.add_argument("--epochs", type=at_least(1), default=None,
                          help=f"passes over the training images (default: {EPOCHS['full']} full, {EPOCHS['fast']} "
                          "fast, the references')")
    protocol.add_argument("--batch-size", type=at_least(1), default=d.batch_size,
                          help="training batch (the reference's 8 GPUs x 128; at most the training images)")
    protocol.add_argument("--lr", type=positive_float, default=d.lr,
                          help="full: base learning rate, x batch / 256, cosine to 0")
    protocol.add_argument("--lr-grid", type=positive_float, nargs="+", default=list(d.lr_grid), metavar="LR",
                          help="fast: base learning rates trained at once, each x batch / 256 (DINOv2's grid)")
    protocol.add_argument("--holdout", type=_holdout, default=d.holdout,
                          help="fast: share of the training images held out to pick the learning rate")
    protocol.add_argument("--last-blocks", type=at_least(1), default=None, metavar="N",
                          help="class tokens of the last N blocks, concatenated (default: 4, DINO's ViT-S choice; "
                          "1 from ViT-B's width 768 on)")
    protocol.add_argument("--avgpool", action=argparse.BooleanOptionalAction, default=None,
                          help="append the last block's mean patch token (default: from ViT-B's width on, as DINO)")
    protocol.add_argument("--prr", action="store_true",
                          help="refine the last block's tokens with PRR first (LocAtViT's pretrained embedding)")
    protocol.add_argument("--seed", type=int, default=d.seed,
                          help="head init, batch order, augmentation, held-out share, subsets, random init")
    runtime.add_argument("--device", default="auto",
                         help="encoder device: auto (CUDA when available), cpu, cuda, cuda:1, ...")
    runtime.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                         help="encoder precision (fp32: the reference's; auto, bf16, int8: faster, see "
                         "locatdino hbird --help)")
    runtime.add_argument("--eval-batch-size", type=at_least(1), default=d.eval_batch_size,
                         help="images per forward when features are computed once")
    runtime.add_argument("--cache-dir", default=None,
                         help="folder for cached features too large for RAM (default: the system's temporary folder)")
    runtime.add_argument("--cache-ram-mb", type=at_least(0), default=d.max_cache_ram_mb,
                         help="largest split of cached features kept in RAM; larger ones are memory-mapped files")
    add_loader_arguments(runtime)
    groups.output.add_argument("--out", default="lincls_results", metavar="DIR", help="results.json + report.md")
    groups.output.add_argument("--overwrite", action="store_true", help="replace results already in --out")
    return p


def _open_splits(args: argparse.Namespace) -> tuple[LabelledImages, LabelledImages]:
    common = dict(seed=args.seed, scene_size=args.scene_size)
    train = open_class_split(args.dataset, args.data_dir, args.train_split, args.num_train, default_scenes=300,
                             option="--num-train", **common)
    val = open_class_split(args.dataset, args.data_dir, args.val_split, args.num_val, default_scenes=100,
                           option="--num-val", **common)
    return train, align_classes(train, val, args.val_split)


def _check_outputs(out: Path, cache_dir: str | None, overwrite: bool) -> None:
    """Fail before any work when ``out`` cannot be written or holds an earlier run's results."""
    earlier = [out / name for name in LINCLS_FILES if (out / name).exists()]
    if earlier and not overwrite:
        raise SystemExit(f"locatdino lincls: --out {out} holds results of an earlier run ({earlier[0]}"
                         f"{f' and {len(earlier) - 1} more' if len(earlier) > 1 else ''}): pass --overwrite to "
                         "replace them, or another --out")
    folders = [(out, "--out")] + ([(Path(cache_dir), "--cache-dir")] if cache_dir is not None else [])
    try:
        for folder, flag in folders:
            ensure_writable(folder, flag)
            remove_stale_temporaries(folder)
    except OSError as err:
        raise SystemExit(f"locatdino lincls: {err}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    runs = model_runs(args, parser)
    device = encoder_device(args.device, "lincls")
    try:
        cfg = replace(LINCLS_TABLE.build(args), lr_grid=tuple(args.lr_grid))
        train, val = _open_splits(args)
        cfg.check_train_size(len(train))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino lincls: {err}") from None
    models = load_backbones(runs, args.seed, cfg.input_size)  # a bad model creates no output folder
    try:
        for run, model in zip(runs, models):
            LinearInput.reference(model, cfg.last_blocks, cfg.avgpool, cfg.prr)
    except ValueError as err:
        raise SystemExit(f"locatdino lincls: --model {run.name}: {err}") from None
    out = Path(args.out)
    _check_outputs(out, cfg.cache_dir, args.overwrite)
    with output_lock(out, "--out"):  # a second run into --out is refused, not raced
        return _evaluate_all(argv, args, cfg, runs, models, train, val, device)


def _evaluate_all(argv: list[str], args: argparse.Namespace, cfg: LinclsConfig, runs: list[ModelRun],
                  models: list[nn.Module], train: LabelledImages, val: LabelledImages, device: torch.device) -> int:
    """Every model's linear evaluation, then the Δ top-1 of each to the first, written once all have run."""
    out = Path(args.out)
    results, hits = [], []
    for run, model in zip(runs, models):
        print(f"[lincls] {run.label}: {len(train)} train / {len(val)} validation images, {len(train.class_names)} "
              f"classes, {cfg.input_size} px, protocol {cfg.protocol}, {cfg.total_epochs} epochs x batch "
              f"{cfg.batch_size}", file=sys.stderr, flush=True)
        scored = linear_classification(model, train, val, len(train.class_names), cfg, device)
        for split, names in scored.skipped.items():
            if names:
                print(f"[lincls] skipped {len(names)} {split} image{'s' * (len(names) != 1)} that do not decode: "
                      f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''} (all named in results.json)",
                      file=sys.stderr, flush=True)
        results.append(record_run(scored.to_dict(), args, run, model))
        hits.append(scored.hits)
        model.cpu()
    for result, model_hits in zip(results[1:], hits[1:]):
        if len(model_hits) == len(hits[0]):  # the same validation images decoded for both
            result["difference"] = accuracy_interval(model_hits, hits[0]).to_dict()
    report = {"command": "locatdino lincls " + shlex.join(argv), "models": results}
    try:
        atomic_write_text(out / "results.json", json.dumps(report, indent=2) + "\n")
        atomic_write_text(out / "report.md", lincls_report(report))
    except DiskFullError as err:
        raise SystemExit(f"locatdino lincls: {err}") from None
    print(lincls_table(results))
    print(f"[lincls] results written to {out}", file=sys.stderr)
    return 0
