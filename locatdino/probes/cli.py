"""``locatdino linprobe``: the paper's dense linear probe from the command line (docs/evaluation.md).

    locatdino linprobe --model locatvit_small_patch16_224:last.ckpt --dataset ade20k \\
        --data-dir data/ADEChallengeData2016 --out runs/linprobe-ade

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are probed one after
another on the same data, batches and seed. One model writes ``OUT/results.json``,
``OUT/per_image_confusion.npz`` and ``OUT/summary.md``; several write them per run under
``OUT/<model>/`` plus ``OUT/summary.md`` comparing them. An earlier run's output there is kept
unless ``--overwrite`` (checked before any work; ``locatdino.common.output_folder``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    add_shared_option,
    at_least,
    non_negative_float,
    option_groups,
)
from locatdino.common.help_format import DefaultsOnceHelpFormatter
from locatdino.common.output_files import DiskFullError
from locatdino.common.output_folder import OutputFolder, add_overwrite_option
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, load_backbones, model_runs
from locatdino.evaluation.options import (
    add_data_arguments,
    add_feature_arguments,
    add_loader_arguments,
    check_outputs,
    encoder_device,
    open_splits,
    record_run,
)
from locatdino.evaluation.splits import CachedSplit
from locatdino.evaluation.train_lists import add_train_list_arguments
from locatdino.probes.dense_probe import PROBE_AUGMENT, LinearProbeConfig, linear_probe
from locatdino.probes.dinov2_protocol import VARIANTS, check_variant_models, parse_variant_args
from locatdino.probes.one_cycle import MIN_STEPS
from locatdino.probes.probe_report import PROBE_FILES, probe_summary, probe_table, write_probe_run

# which option sets which LinearProbeConfig field
PROBE_TABLE = ConfigTable(
    LinearProbeConfig,
    options={
        "--input-size": "input_size",
        "--iters": "iterations",
        "--epochs": "epochs",
        "--train-batch-size": "batch_size",
        "--lr": "lr",
        "--weight-decay": "weight_decay",
        "--train-augment": "augment",
        "--no-cache": "cache",
        "--cache-dir": "cache_dir",
        "--cache-ram-mb": "max_cache_ram_mb",
        "--layer": "layer",
        "--norm": "norm",
        "--prr": "prr",
        "--precision": "precision",
        "--batch-size": "eval_batch_size",
        "--workers": "num_workers",
        "--seed": "seed",
        "--no-progress": "progress",
        "--variant": "variant",
    },
    internal={},
    negated=frozenset({"--no-cache", "--no-progress"}),
)


def _parser() -> ArgumentParser:
    d = LinearProbeConfig()
    p = ArgumentParser(
        prog="locatdino linprobe",
        description="The paper's segmentation metric: train a linear head (1x1 conv -> 512, GroupNorm(1, 512), "
        "GELU, 1x1 conv) on the frozen last-block patch tokens, report the mIoU on the query split.",
        formatter_class=DefaultsOnceHelpFormatter,
    )
    groups = option_groups(p)
    add_model_arguments(groups.model)
    add_data_arguments(groups.data)
    add_train_list_arguments(groups.data)
    protocol, runtime = groups.protocol, groups.runtime
    protocol.add_argument(
        "--variant",
        choices=VARIANTS,
        default=d.variant,
        help="paper: the head above; dinov2 / dinov2-ms: DINOv2's linear segmentation ('lin.' / '+ms': BatchNorm "
        "+ 1x1 conv on the last block / last 4 blocks, its schedule, sliding-window evaluation at one scale / 5 "
        "scales with flips), whose settings become the defaults of the options below (docs/evaluation.md)",
    )
    add_shared_option(protocol, "--input-size", d.input_size)
    budget = protocol.add_mutually_exclusive_group()
    budget.add_argument(
        "--iters",
        type=at_least(MIN_STEPS),
        default=d.iterations,
        help=f"training iterations (default {d.iterations:,}, the paper's)",
    )
    add_shared_option(budget, "--epochs", note="--iters instead")
    add_shared_option(protocol, "--train-batch-size", d.batch_size, note=f"{d.batch_size}, the paper's")
    add_shared_option(protocol, "--lr", d.lr)
    protocol.add_argument("--weight-decay", type=non_negative_float, default=d.weight_decay, help="AdamW weight decay")
    protocol.add_argument(
        "--train-augment",
        choices=PROBE_AUGMENT,
        default=d.augment,
        help="training views of the head: reference (the paper's resize / crop / flip / "
        "photometric augmentation, backbone every iteration) or off (whole images resized to "
        "S x S, features cached once)",
    )
    add_feature_arguments(groups, d)
    add_shared_option(protocol, "--seed", d.seed)
    runtime.add_argument(
        "--no-cache",
        action="store_true",
        help="with --train-augment off, recompute the features every iteration (the cached path's check)",
    )
    add_shared_option(runtime, "--cache-dir")
    add_shared_option(runtime, "--cache-ram-mb", d.max_cache_ram_mb)
    add_shared_option(runtime, "--batch-size", d.eval_batch_size)
    add_loader_arguments(runtime)
    add_shared_option(groups.output, "--out", "linprobe_results")
    add_overwrite_option(groups.output)
    return p


def config_from_args(args: argparse.Namespace) -> LinearProbeConfig:
    """The :class:`LinearProbeConfig` of parsed options (``ValueError`` when they disagree)."""
    return PROBE_TABLE.build(args)


def _planned(labels: list[str]) -> list[str]:
    """The files of a run of ``labels``: one model's in ``--out``, several models' per label plus the comparison."""
    return (
        PROBE_FILES
        if len(labels) == 1
        else ["summary.md", *(f"{label}/{name}" for label in labels for name in PROBE_FILES)]
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parse_variant_args(parser, argv)
    runs = model_runs(args, parser, PROBE_FILES)
    device = encoder_device(args.device, "linprobe")
    try:
        cfg = config_from_args(args)  # inconsistent settings fail before any data is read
        train_set, val_set = open_splits(args)
        cfg.check_train_size(len(train_set))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"locatdino linprobe: {err}") from None
    asked = cfg.epoch_iterations(len(train_set))
    if asked is not None and asked < MIN_STEPS:
        print(
            f"[linprobe] note: --epochs {args.epochs:g} is {asked} iteration{'s' * (asked != 1)} of {cfg.batch_size} "
            f"over {len(train_set)} images; raised to {MIN_STEPS}, the OneCycle schedule's minimum",
            file=sys.stderr,
        )
    if args.dataset == "scenes":  # rendered once, read at every epoch and by every model
        train_set, val_set = CachedSplit(train_set), CachedSplit(val_set)
    models = load_backbones(runs, args.seed, args.input_size, args.layer)  # a bad model creates no output folder
    check_variant_models(cfg, [run.label for run in runs], models)
    folder = check_outputs(args.out, "linprobe", _planned([run.label for run in runs]), args.cache_dir, args.overwrite)
    with folder.writing(args.overwrite):  # a second run into --out is refused, not raced
        return _probe_all(args, runs, models, train_set, val_set, cfg, device, folder)


def _probe_all(
    args: argparse.Namespace,
    runs: list[ModelRun],
    models: list[nn.Module],
    train_set: Any,
    val_set: Any,
    cfg: LinearProbeConfig,
    device: torch.device,
    folder: OutputFolder,
) -> int:
    """Every model's probe, each written (and recorded) as it finishes, then the comparison of them all."""
    out = folder.path
    results = []
    for run, model in zip(runs, models):
        label, iterations = run.label, cfg.total_iterations(len(train_set))
        print(
            f"[linprobe] {label}: {len(train_set)} training images, {len(val_set)} queries, {args.input_size} px, "
            f"{iterations:,} iterations x {cfg.batch_size}, augmentation {cfg.augment}, protocol {cfg.variant}"
            f"{' (features cached)' if cfg.cached else ''}",
            file=sys.stderr,
            flush=True,
        )
        probe = linear_probe(model.to(device), train_set, val_set, cfg)
        result = record_run(probe.to_dict(), args, run, model)
        try:
            run_dir = out if len(runs) == 1 else out / label
            write_probe_run(result, probe.image_confusions, run_dir)
            folder.wrote(*(run_dir / name for name in PROBE_FILES))
        except DiskFullError as err:
            raise SystemExit(f"locatdino linprobe: {err}") from None
        results.append(result)
    if len(results) > 1:
        folder.write_text("summary.md", probe_summary(results, "Dense linear probe comparison"))
    print(probe_table(results))
    print(f"[linprobe] results written to {out}", file=sys.stderr)
    return 0
