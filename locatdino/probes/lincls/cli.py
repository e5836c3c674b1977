"""``locatdino lincls``: linear classification on frozen class tokens (docs/evaluation.md).

    locatdino lincls --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --dataset imagefolder --data-dir data/imagenet --out runs/lincls-in1k
    locatdino lincls --variant fast --model ... --out runs/lincls-fast

``--variant full`` is DINO's ``eval_linear`` (augmented views through the backbone every epoch);
``fast`` DINOv2's grid of learning rates on cached features (``locatdino.probes.lincls.protocol``).
Not the dense ``linprobe``, which trains a segmentation head on patch tokens. Several
``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) run one after another on the same
images, the first the reference of every Δ. ``OUT/results.json`` holds, per model, top-1 and
top-5 with 95 % Wilson intervals over the validation images and the Δ top-1 to the first model
with its paired-bootstrap interval; ``OUT/report.md`` the same as tables. An earlier run's output
there is kept unless ``--overwrite`` (checked before any work; ``locatdino.common.output_folder``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from dataclasses import replace

import torch
from torch import nn

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    add_shared_option,
    at_least,
    option_groups,
    positive_float,
)
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_files import DiskFullError
from locatdino.common.output_folder import OutputFolder, add_overwrite_option
from locatdino.evaluation.bootstrap import accuracy_interval
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import (
    add_data_arguments,
    add_encoder_arguments,
    add_loader_arguments,
    add_prr_argument,
    check_outputs,
    encoder_device,
    record_run,
)
from locatdino.evaluation.ranks import checked_by_writer, evaluation_ranks
from locatdino.probes.class_splits import CLASS_DATASETS, LabelledImages, note_skipped, open_class_splits
from locatdino.probes.lincls.features import LinearInput
from locatdino.probes.lincls.protocol import EPOCHS, PROTOCOLS, LinclsConfig, linear_classification
from locatdino.probes.lincls.report import LINCLS_FILES, lincls_report, lincls_table

LINCLS_TABLE = ConfigTable(
    LinclsConfig,
    options={
        "--variant": "protocol",
        "--input-size": "input_size",
        "--epochs": "epochs",
        "--train-batch-size": "batch_size",
        "--lr": "lr",
        "--lr-grid": "lr_grid",
        "--holdout": "holdout",
        "--last-blocks": "last_blocks",
        "--avgpool": "avgpool",
        "--prr": "prr",
        "--precision": "precision",
        "--batch-size": "eval_batch_size",
        "--cache-dir": "cache_dir",
        "--cache-ram-mb": "max_cache_ram_mb",
        "--workers": "num_workers",
        "--seed": "seed",
        "--no-progress": "progress",
    },
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
        description="Linear classification on frozen class tokens (DINO's eval_linear; --variant fast: DINOv2's "
        "lr grid on cached features): top-1 / top-5 on the validation images, written to OUT/results.json and "
        "OUT/report.md. Not the dense linprobe.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model)
    add_data_arguments(groups.data, CLASS_DATASETS)
    protocol, runtime = groups.protocol, groups.runtime
    protocol.add_argument(
        "--variant",
        choices=PROTOCOLS,
        default=d.protocol,
        help="full: DINO's eval_linear (RandomResizedCrop + flip views through the backbone every "
        "epoch); fast: DINOv2's grid of learning rates trained at once on cached centre-crop "
        "features, the best picked on --holdout",
    )
    add_shared_option(protocol, "--input-size", d.input_size, note="224, the reference's Resize 256 / CenterCrop 224")
    add_shared_option(
        protocol,
        "--epochs",
        note=f"{EPOCHS['full']} full, {EPOCHS['fast']} fast, the references'; "
        "whole passes: the reference's cosine steps once per epoch",
    )
    add_shared_option(
        protocol,
        "--train-batch-size",
        d.batch_size,
        note=f"{d.batch_size}, the reference's 8 GPUs x 128; the lr scales with it",
    )
    add_shared_option(protocol, "--lr", d.lr)
    protocol.add_argument(
        "--lr-grid",
        type=positive_float,
        nargs="+",
        default=list(d.lr_grid),
        metavar="LR",
        help="fast: base learning rates trained at once, each x batch / 256 (DINOv2's grid)",
    )
    protocol.add_argument(
        "--holdout",
        type=_holdout,
        default=d.holdout,
        help="fast: share of the training images held out to pick the learning rate",
    )
    protocol.add_argument(
        "--last-blocks",
        type=at_least(1),
        default=None,
        metavar="N",
        help="class tokens of the last N blocks, concatenated (default: 4, DINO's ViT-S choice; "
        "1 from ViT-B's width 768 on)",
    )
    protocol.add_argument(
        "--avgpool",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append the last block's mean patch token (default: from ViT-B's width on, as DINO)",
    )
    add_prr_argument(protocol)  # on the last block's tokens, LocAtViT's pretrained embedding
    add_shared_option(protocol, "--seed", d.seed)
    add_encoder_arguments(runtime, d.precision)
    add_shared_option(runtime, "--batch-size", d.eval_batch_size)
    add_shared_option(runtime, "--cache-dir")
    add_shared_option(runtime, "--cache-ram-mb", d.max_cache_ram_mb)
    add_loader_arguments(runtime)
    add_shared_option(groups.output, "--out", "lincls_results")
    add_overwrite_option(groups.output)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    runs = model_runs(args, parser, LINCLS_FILES)
    device = encoder_device(args.device, "lincls")
    try:
        cfg = replace(LINCLS_TABLE.build(args), lr_grid=tuple(args.lr_grid))
        train, val = open_class_splits(args)
        cfg.check_train_size(len(train))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino lincls: {err}") from None
    models = load_backbones(runs, args.seed, cfg.input_size)  # a bad model creates no output folder
    for run, model in zip(runs, models):
        try:
            LinearInput.reference(model, cfg.last_blocks, cfg.avgpool, cfg.prr)
        except ValueError as err:
            raise SystemExit(f"locatdino lincls: --model {run.name}: {err}") from None
    with evaluation_ranks(device) as launch:  # one process, or each rank of a torchrun / srun launch
        folder = checked_by_writer(
            lambda: check_outputs(args.out, "lincls", LINCLS_FILES, cfg.cache_dir, args.overwrite)
        )
        with folder.writing(args.overwrite) if folder else contextlib.nullcontext():  # a second run is refused
            return _evaluate_all(argv, args, cfg, runs, models, train, val, launch.device(device), folder)


def _evaluate_all(
    argv: list[str],
    args: argparse.Namespace,
    cfg: LinclsConfig,
    runs: list[ModelRun],
    models: list[nn.Module],
    train: LabelledImages,
    val: LabelledImages,
    device: torch.device,
    folder: OutputFolder | None,
) -> int:
    """Every model's linear evaluation with its Δ top-1 to the first; the reports are rewritten (and
    recorded) as each model finishes, so a stop or a failure in a later model keeps the earlier ones' results."""
    results, hits = [], []
    for run, model in zip(runs, models):
        print(
            f"[lincls] {run.label}: {len(train)} train / {len(val)} validation images, {len(train.class_names)} "
            f"classes, {cfg.input_size} px, variant {cfg.protocol}, {cfg.total_epochs} epochs x batch "
            f"{cfg.batch_size}",
            file=sys.stderr,
            flush=True,
        )
        scored = linear_classification(model, train, val, len(train.class_names), cfg, device, shared=True)
        for split, names in scored.skipped.items():
            note_skipped("lincls", split, names)
        result = record_run(scored.to_dict(), args, run, model)
        if hits and len(scored.hits) == len(hits[0]):  # the same validation images decoded for both
            result["difference"] = accuracy_interval(scored.hits, hits[0]).to_dict()
        results.append(result)
        hits.append(scored.hits)
        model.cpu()
        report = {"command": "locatdino lincls " + shlex.join(argv), "models": results}
        if folder is None:  # a rank other than 0: rank 0 writes
            continue
        try:
            folder.write_text("results.json", json.dumps(report, indent=2) + "\n")
            folder.write_text("report.md", lincls_report(report))
        except DiskFullError as err:
            raise SystemExit(f"locatdino lincls: {err}") from None
    if folder is not None:
        print(lincls_table(results))
        print(f"[lincls] results written to {folder.path}", file=sys.stderr)
    return 0
