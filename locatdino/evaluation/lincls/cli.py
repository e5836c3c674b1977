"""``locatdino lincls``: linear classification on frozen class tokens (docs/evaluation.md).

    locatdino lincls --model vit_small_patch16_224:dino_deitsmall16_pretrain.pth \\
        --dataset imagefolder --data-dir data/imagenet --out runs/lincls-in1k
    locatdino lincls --variant fast --model ... --out runs/lincls-fast

``--variant full`` is DINO's ``eval_linear`` (augmented views through the backbone every epoch);
``fast`` DINOv2's grid of learning rates on cached features (``locatdino.evaluation.lincls.protocol``).
Not the dense ``linprobe``, which trains a segmentation head on patch tokens. Several
``--model [LABEL=]NAME[:CHECKPOINT]`` (``none``: random init) run one after another on the same
images, the first the reference of every Δ. ``OUT/results.json`` holds, per model, top-1 and
top-5 with 95 % Wilson intervals over the validation images and the Δ top-1 to the first model
with its paired-bootstrap interval; ``OUT/report.md`` the same as tables. An earlier run's output
there is kept unless ``--overwrite`` (checked before any work; ``locatdino.common.output_folder``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from locatdino.common.arguments import (
    ArgumentParser,
    ConfigTable,
    OptionGroups,
    add_shared_option,
    at_least,
    positive_float,
)
from locatdino.evaluation.bootstrap import accuracy_interval
from locatdino.evaluation.class_splits import CLASS_DATASETS, LabelledImages, note_skipped, open_class_splits
from locatdino.evaluation.lincls.features import LinearInput
from locatdino.evaluation.lincls.protocol import EPOCHS, PROTOCOLS, LinclsConfig, linear_classification
from locatdino.evaluation.lincls.report import LINCLS_LAYOUT
from locatdino.evaluation.model_runs import ModelRun
from locatdino.evaluation.options import (
    add_data_arguments,
    add_encoder_arguments,
    add_loader_arguments,
    add_prr_argument,
)
from locatdino.evaluation.results import ReportLayout
from locatdino.evaluation.runner import Protocol, Scored, build_parser, run

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


def _add_arguments(groups: OptionGroups) -> None:
    d = LinclsConfig()
    add_data_arguments(groups.data, CLASS_DATASETS, command="lincls")
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
    add_shared_option(protocol, "--lr", d.lr, use="--variant full: the base rate, x batch / 256, cosine to 0")
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
    add_shared_option(
        runtime, "--batch-size", d.eval_batch_size, use="the class tokens (the classifier trains on --train-batch-size)"
    )
    add_shared_option(runtime, "--cache-dir")
    add_shared_option(runtime, "--cache-ram-mb", d.max_cache_ram_mb)
    add_loader_arguments(runtime)


@dataclass(frozen=True)
class LinclsSetup:
    """What every model of a run is trained and scored with."""

    cfg: LinclsConfig
    train: LabelledImages
    val: LabelledImages


class LinclsProtocol(Protocol):
    command = "lincls"
    description = (
        "Linear classification on frozen class tokens (DINO's eval_linear; --variant fast: DINOv2's lr grid on "
        "cached features): top-1 / top-5 on the validation images, written to OUT/results.json and OUT/report.md. "
        "Not the dense linprobe."
    )
    out_default = "lincls_results"

    @property
    def layout(self) -> ReportLayout:
        return LINCLS_LAYOUT

    def add_arguments(self, groups: OptionGroups) -> None:
        _add_arguments(groups)

    def prepare(self, args: argparse.Namespace) -> LinclsSetup:
        cfg = replace(LINCLS_TABLE.build(args), lr_grid=tuple(args.lr_grid))
        train, val = open_class_splits(args)
        cfg.check_train_size(len(train))
        return LinclsSetup(cfg, train, val)

    def load_options(self, args: argparse.Namespace, setup: LinclsSetup) -> dict[str, Any]:
        return {"input_size": setup.cfg.input_size}

    def check_model(self, run: ModelRun, model: nn.Module, setup: LinclsSetup) -> None:
        LinearInput.reference(model, setup.cfg.last_blocks, setup.cfg.avgpool, setup.cfg.prr)

    def announce(self, run: ModelRun, setup: LinclsSetup) -> str:
        cfg = setup.cfg
        return (
            f"{len(setup.train)} train / {len(setup.val)} validation images, {len(setup.train.class_names)} "
            f"classes, {cfg.input_size} px, variant {cfg.protocol}, {cfg.total_epochs} epochs x batch {cfg.batch_size}"
        )

    def score(self, model: nn.Module, run: ModelRun, setup: LinclsSetup, device: torch.device) -> Scored:
        classes = len(setup.train.class_names)
        scored = linear_classification(model, setup.train, setup.val, classes, setup.cfg, device, shared=True)
        for split, names in scored.skipped.items():
            note_skipped("lincls", split, names)
        return Scored(scored.to_dict(), paired=scored.hits)

    def difference(self, scored: Scored, first: Scored, setup: LinclsSetup) -> dict[str, Any] | None:
        if len(scored.paired) != len(first.paired):  # not the same validation images decoded
            return None
        return {"": {"top1": accuracy_interval(scored.paired, first.paired).to_dict()}}


def _parser() -> ArgumentParser:
    return build_parser(LinclsProtocol())


def main(argv: list[str] | None = None) -> int:
    return run(LinclsProtocol(), argv)
