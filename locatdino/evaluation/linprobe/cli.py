"""``locatdino linprobe``: the paper's dense linear probe from the command line (docs/evaluation.md).

    locatdino linprobe --model locatvit_small_patch16_224:last.ckpt --dataset ade20k \\
        --data-dir data/ADEChallengeData2016 --out runs/linprobe-ade

Several ``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) are probed one after
another on the same data, batches and seed, the first the reference of every Δ mIoU. The
evaluation runner (:mod:`locatdino.evaluation.runner`) writes ``OUT/results.json`` and
``OUT/report.md`` for all of them, and each model's per-image confusion matrices to
``OUT/<label>/per_image_confusion.npz``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    OptionGroups,
    add_shared_option,
    at_least,
    non_negative_float,
)
from locatdino.evaluation.bootstrap import miou_interval
from locatdino.evaluation.image_confusions import CONFUSION_FILE
from locatdino.evaluation.linprobe.dinov2_protocol import VARIANTS, check_variant_models, parse_variant_args
from locatdino.evaluation.linprobe.one_cycle import MIN_STEPS
from locatdino.evaluation.linprobe.protocol import PROBE_AUGMENT, LinearProbeConfig, linear_probe
from locatdino.evaluation.linprobe.report import LINPROBE_LAYOUT
from locatdino.evaluation.model_runs import ModelRun
from locatdino.evaluation.options import add_data_arguments, add_feature_arguments, add_loader_arguments, open_splits
from locatdino.evaluation.results import ReportLayout
from locatdino.evaluation.runner import Protocol, Scored, build_parser, run, with_confusions
from locatdino.evaluation.splits import CachedSplit
from locatdino.evaluation.train_lists import add_train_list_arguments

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


def _add_arguments(groups: OptionGroups) -> None:
    d = LinearProbeConfig()
    add_data_arguments(groups.data, command="linprobe")
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
    add_shared_option(
        protocol, "--input-size", d.input_size, note="512, the paper's training crop and evaluation short side"
    )
    budget = protocol.add_mutually_exclusive_group()
    budget.add_argument(
        "--iters",
        type=at_least(MIN_STEPS),
        default=d.iterations,
        help=f"training iterations (default {d.iterations:,}, the paper's)",
    )
    add_shared_option(budget, "--epochs", note="--iters instead")
    add_shared_option(protocol, "--train-batch-size", d.batch_size, note=f"{d.batch_size}, the paper's")
    add_shared_option(protocol, "--lr", d.lr, use="the OneCycle schedule's peak")
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
    add_shared_option(
        runtime, "--batch-size", d.eval_batch_size, use="the query images (the head trains on --train-batch-size)"
    )
    add_loader_arguments(runtime)


def config_from_args(args: argparse.Namespace) -> LinearProbeConfig:
    """The :class:`LinearProbeConfig` of parsed options (``ValueError`` when they disagree)."""
    return PROBE_TABLE.build(args)


@dataclass(frozen=True)
class ProbeSetup:
    """What every model of a run is probed with."""

    cfg: LinearProbeConfig
    train: Any
    val: Any


class LinprobeProtocol(Protocol):
    command = "linprobe"
    description = (
        "The paper's segmentation metric: train a linear head (1x1 conv -> 512, GroupNorm(1, 512), GELU, 1x1 conv) "
        "on the frozen last-block patch tokens, report the mIoU on the query split."
    )
    out_default = "linprobe_results"
    artefact_files = (CONFUSION_FILE,)

    @property
    def layout(self) -> ReportLayout:
        return LINPROBE_LAYOUT

    def add_arguments(self, groups: OptionGroups) -> None:
        _add_arguments(groups)

    def parse(self, parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
        return parse_variant_args(parser, argv)

    def prepare(self, args: argparse.Namespace) -> ProbeSetup:
        cfg = config_from_args(args)  # inconsistent settings fail before any data is read
        train, val = open_splits(args)
        cfg.check_train_size(len(train))
        asked = cfg.epoch_iterations(len(train))
        if asked is not None and asked < MIN_STEPS:
            print(
                f"[linprobe] note: --epochs {args.epochs:g} is {asked} iteration{'s' * (asked != 1)} of "
                f"{cfg.batch_size} over {len(train)} images; raised to {MIN_STEPS}, the OneCycle schedule's minimum",
                file=sys.stderr,
            )
        if args.dataset == "scenes":  # rendered once, read at every epoch and by every model
            train, val = CachedSplit(train), CachedSplit(val)
        return ProbeSetup(cfg, train, val)

    def load_options(self, args: argparse.Namespace, setup: ProbeSetup) -> dict[str, Any]:
        return {"input_size": args.input_size, "layer": args.layer}

    def check_model(self, run: ModelRun, model: nn.Module, setup: ProbeSetup) -> None:
        check_variant_models(setup.cfg, [run.label], [model])

    def announce(self, run: ModelRun, setup: ProbeSetup) -> str:
        cfg = setup.cfg
        return (
            f"{len(setup.train)} training images, {len(setup.val)} queries, {cfg.input_size} px, "
            f"{cfg.total_iterations(len(setup.train)):,} iterations x {cfg.batch_size}, augmentation {cfg.augment}, "
            f"protocol {cfg.variant}{' (features cached)' if cfg.cached else ''}"
        )

    def score(self, model: nn.Module, run: ModelRun, setup: ProbeSetup, device: torch.device) -> Scored:
        probe = linear_probe(model, setup.train, setup.val, setup.cfg, shared=True)  # each rank its share
        return with_confusions(probe.to_dict(), run, probe.image_confusions)

    def difference(self, scored: Scored, first: Scored, setup: ProbeSetup) -> dict[str, Any] | None:
        if scored.paired is None or first.paired is None or scored.paired.num_images != first.paired.num_images:
            return None
        return {"": {"miou": miou_interval(scored.paired, first.paired).to_dict()}}


def _parser() -> ArgumentParser:
    return build_parser(LinprobeProtocol())


def main(argv: list[str] | None = None) -> int:
    return run(LinprobeProtocol(), argv)
