"""The image augmentation of supervised pretraining: timm's ImageNet recipe (docs/pretraining.md).

A thin, YAML-configurable record of ``timm.data.create_transform``'s arguments; the transforms
themselves are timm's (random-resized crop, flip, RandAugment, colour jitter, normalisation,
random erasing for training; resize + centre crop + normalisation for evaluation). Defaults are
the DeiT / LocAtViT settings: RandAugment ``rand-m9-mstd0.5-inc1``, colour jitter 0.4, random
erasing 0.25 (per-pixel noise), bicubic. Mixup / CutMix act on whole batches and live in the
LightningModule (``locatdino.ssl.SupervisedModule``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from PIL import Image
from timm.data import auto_augment, create_transform


def _posterize_at_least_one_bit(level: float, hparams: dict) -> tuple[int]:
    """timm's ``PosterizeIncreasing`` argument (4 → 0 kept bits as the magnitude grows), with at
    least 1 bit: at magnitude 10 (reached with ``mstd`` noise) timm asks for 0 bits, which
    Pillow ≥ 12 refuses ("bits must be between 1 and 8"; older Pillow returned a black image), so
    the sample would be dropped. 1 bit is the two-level image closest to that intent."""
    return (max(1, _posterize_increasing(level, hparams)[0]),)


_posterize_increasing = auto_augment.LEVEL_TO_ARG["PosterizeIncreasing"]
auto_augment.LEVEL_TO_ARG["PosterizeIncreasing"] = _posterize_at_least_one_bit


@dataclass
class ClassificationTransform:
    """timm's training and evaluation transforms at ``input_size`` px (normalised ``[3, H, W]``).

    Args:
        input_size: side of the network's input.
        scale: area range of the random-resized crop (timm: 0.08–1).
        ratio: aspect-ratio range of the crop.
        hflip: horizontal flip probability.
        auto_augment: timm's policy string (``rand-m9-mstd0.5-inc1``; ``None`` disables).
        color_jitter: brightness/contrast/saturation jitter (timm skips it when RandAugment is on).
        re_prob: random-erasing probability (0 disables).
        re_mode: random-erasing fill (``pixel``: per-pixel normal noise).
        interpolation: resize interpolation.
        crop_pct: evaluation centre-crop fraction (1.0: the whole image).
    """

    input_size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    color_jitter: float = 0.4
    re_prob: float = 0.25
    re_mode: str = "pixel"
    interpolation: str = "bicubic"
    crop_pct: float = 0.875

    def __post_init__(self) -> None:
        # jsonargparse turns a command-line ``...transform.auto_augment null`` into the string "None"
        if self.auto_augment in ("None", "null", "none", ""):
            self.auto_augment = None

    def train(self) -> Callable[[Image.Image], torch.Tensor]:
        """The augmented training transform."""
        return create_transform(
            self.input_size,
            is_training=True,
            scale=self.scale,
            ratio=self.ratio,
            hflip=self.hflip,
            auto_augment=self.auto_augment,
            color_jitter=self.color_jitter,
            re_prob=self.re_prob,
            re_mode=self.re_mode,
            interpolation=self.interpolation,
        )

    def eval(self) -> Callable[[Image.Image], torch.Tensor]:
        """The deterministic held-out transform (resize, centre crop)."""
        return create_transform(
            self.input_size, is_training=False, crop_pct=self.crop_pct, interpolation=self.interpolation
        )
