"""The settings of ``linprobe --variant dinov2 | dinov2-ms`` (docs/evaluation.md): DINOv2's linear
segmentation evaluation, its "lin." and "+ms" columns.

Read from DINOv2's MMSegmentation configs (``dinov2_vit*14_ade20k_{linear,ms}_config.py``, which
facebookresearch/dinov2 ``notebooks/semantic_segmentation.ipynb`` loads) and DINOv3's re-write
(facebookresearch/dinov3 ``dinov3/eval/segmentation/configs/config-ade20k-linear-training.yaml``):

- ``dinov2`` ("lin."): the last block; crop 512; training resize to fit (2048, 512) × U(0.5, 2);
  evaluation at one scale, short side 512, sliding 512 windows with stride 341, no flip;
- ``dinov2-ms`` ("+ms"): the last 4 blocks concatenated; crop 640; training resize to short side
  640 × U(1, 3) (no long-side bound); evaluation at short sides 640 × (1, 1.32, 1.73, 2.28, 3), each
  also flipped, the 10 predictions' softmax averaged (:mod:`~locatdino.evaluation.linprobe.multiscale`);
- both: AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 1e-4), 40,000 iterations of batch 16
  (2 per GPU × 8), MMCV's ``poly`` schedule (power 1, to 0) under a linear warm-up of 1,500
  iterations from 1e-6 × lr (:func:`poly_warmup`), cross-entropy over every pixel of the crop
  (ignored ones counting 0), the final norm on every block's tokens.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from locatdino.common.arguments import ArgumentParser, option_dest
from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.linprobe.dinov2_head import BlockTokens, check_blocks
from locatdino.evaluation.linprobe.multiscale import evaluate_views, logits_of
from locatdino.evaluation.linprobe.transforms import ProbeAugmentation
from locatdino.evaluation.metric import ConfusionMatrix
from locatdino.evaluation.phase_clock import PhaseClock

PAPER = "paper"
WARMUP_ITERS = 1500
WARMUP_RATIO = 1e-6


@dataclass(frozen=True)
class Dinov2Setting:
    """One column of DINOv2's linear segmentation table (module docs)."""

    blocks: int  # last blocks concatenated
    crop: int  # training crop side and sliding-window side at evaluation
    resize_ratio: tuple[float, float]  # training short side = crop × U(ratio)
    long_to_short: float  # the training resize's long-side bound, × the short side (inf: none)
    scales: tuple[float, ...]  # evaluation short sides, × crop
    flip: bool  # evaluation also on the horizontally flipped image


SETTINGS = {
    "dinov2": Dinov2Setting(1, 512, (0.5, 2.0), 4.0, (1.0,), False),
    "dinov2-ms": Dinov2Setting(4, 640, (1.0, 3.0), math.inf, (1.0, 1.32, 1.73, 2.28, 3.0), True),
}
VARIANTS = (PAPER, *SETTINGS)
# the command-line defaults of every DINOv2 variant, by option (an option given beside --variant wins)
DEFAULTS = {"--iters": 40_000, "--train-batch-size": 16, "--lr": 1e-3, "--weight-decay": 1e-4, "--norm": True}


def sliding_stride(crop: int) -> int:
    """Two thirds of the window, rounded down: the configs' 341 for 512 px windows."""
    return 2 * crop // 3


def parse_variant_args(parser: ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with ``--variant``'s settings as the defaults (``--input-size`` its crop)."""
    args = parser.parse_args(argv)
    if args.variant == PAPER:
        return args
    settings = {**DEFAULTS, "--input-size": SETTINGS[args.variant].crop}
    parser.set_defaults(**{option_dest(option): value for option, value in settings.items()})
    return parser.parse_args(argv)


def poly_warmup(optimizer: torch.optim.Optimizer, iterations: int) -> LambdaLR:
    """MMCV's ``poly`` (power 1, min 0) with its linear warm-up: at step ``i`` the lr is
    ``lr · (1 − i / T) · w(i)``, ``w(i) = 1 − (1 − i / W)(1 − 1e-6)`` for ``i < W`` and 1 after, with
    ``W`` = 1,500 (at most ``T``, the run's iterations); call ``step()`` after each ``optimizer.step()``."""
    warmup = min(WARMUP_ITERS, iterations)

    def factor(step: int) -> float:
        ramp = 1 - (1 - step / warmup) * (1 - WARMUP_RATIO) if step < warmup else 1.0
        return (1 - step / iterations) * ramp

    return LambdaLR(optimizer, factor)


def probe_augmentation(variant: str, size: int) -> ProbeAugmentation:
    """The training augmentation of ``variant`` at crop ``size``: the paper's, or DINOv2's resize range."""
    if variant == PAPER:
        return ProbeAugmentation(size)
    setting = SETTINGS[variant]
    return ProbeAugmentation(size, ratio=setting.resize_ratio, long_to_short=setting.long_to_short)


def frozen_tokens(model: nn.Module, cfg: Any) -> FeatureExtractor:
    """The frozen tokens the probe of ``cfg`` trains on: the paper's (one block, ``cfg.norm``,
    ``cfg.prr``) or ``cfg.variant``'s blocks up to ``cfg.layer`` (refused in one line for a model
    without them)."""
    if cfg.variant == PAPER:
        return FeatureExtractor(
            model,
            layer=cfg.layer,
            norm=cfg.norm,
            prr=cfg.prr,
            precision=cfg.precision,
            l2_normalize=False,
            to_cpu=False,
        )
    blocks = SETTINGS[cfg.variant].blocks
    check_blocks(model, type(model).__name__, cfg.variant, blocks, cfg.layer)
    return BlockTokens(model, blocks, cfg.layer, cfg.norm, cfg.precision)


def check_variant_models(cfg: Any, names: list[str], models: list[nn.Module]) -> None:
    """:class:`UserError` (one line) for the first model ``cfg.variant`` cannot probe, before any work."""
    if cfg.variant != PAPER:
        for name, model in zip(names, models):
            check_blocks(model, name, cfg.variant, SETTINGS[cfg.variant].blocks, cfg.layer)


def evaluate_variant(
    extractor: BlockTokens, head: nn.Module, dataset: Any, variant: str, cfg: Any, workers: int, clock: PhaseClock
) -> tuple[ConfusionMatrix, ConfusionMatrix, int]:
    """DINOv2's evaluation of ``head`` at ``cfg.input_size`` (:func:`~.multiscale.evaluate_views`):
    the merged and the one-scale confusion matrices and the skipped samples."""
    setting = SETTINGS[variant]
    return evaluate_views(
        logits_of(extractor, head),
        dataset,
        crop=cfg.input_size,
        stride=sliding_stride(cfg.input_size),
        patch=extractor.patch_size,
        scales=setting.scales,
        flip=setting.flip,
        long_to_short=setting.long_to_short,
        num_workers=workers,
        batch_size=cfg.eval_batch_size,
        show_progress=cfg.progress,
        clock=clock,
    )
