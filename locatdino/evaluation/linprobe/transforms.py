"""Image and label preprocessing of the dense linear probe (docs/evaluation.md), MMSegmentation's pipelines
re-written on torch tensors.

Training (``ProbeAugmentation``, the paper's ADE20K / Pascal Context / COCO-Stuff recipe at crop
``S`` = 512):

1. random resize, keep ratio: the image is scaled to fit ``(4S·r, S·r)`` (long side, short side)
   with ``r ~ U(0.5, 2)`` (MMSegmentation's ``RandomResize(scale=(2048, 512), ratio_range=(0.5,
   2))``); image bilinear, labels nearest;
2. random crop ``S × S`` (the whole side when the image is smaller); a crop where one class holds
   75 % or more of the labelled pixels, or with fewer than two classes, is re-drawn, up to 10 times,
   keeping the last draw (``RandomCrop(cat_max_ratio=0.75)``);
3. horizontal flip, p 0.5;
4. photometric distortion (``PhotoMetricDistortion``): each step with p 0.5 — brightness
   ``+U(−32, 32)`` (of 255), contrast ``×U(0.5, 1.5)`` (before the colour steps or after them,
   each with p 0.5), saturation ``×U(0.5, 1.5)`` of the HSV saturation, hue ``+d/180`` of a turn
   for an integer ``d`` in ``[−18, 18)`` (OpenCV's 8-bit hue unit is 2°), clipped to [0, 255];
5. pad to ``S × S`` at the bottom / right: image with the ImageNet mean colour (0 after
   normalisation, as MMSegmentation pads normalised images with 0), labels with :data:`IGNORE`.

Evaluation (:func:`eval_view`): the whole image scaled to fit ``(4S, S)`` (short side ``S`` for
every aspect ratio up to 4:1), one scale, no flip; padded at the bottom / right to a multiple of
the patch size (the ViT needs whole patches; the padding is cropped off the logits).

Labels are training targets here (:func:`training_targets`): the dataset's ignore value, values
outside its classes and padding all become :data:`IGNORE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode

from locatdino.data.transforms.photometric import adjust_hue
from locatdino.evaluation.augment import MEAN_RGB, NEAREST_EXACT

IGNORE = -1
"""Target value of pixels that take no part in the loss: void / ignored labels and padding."""
LONG_TO_SHORT = 4  # MMSegmentation's scale (2048, 512): the long side may reach 4× the short one


def training_targets(mask: Tensor, num_classes: int, ignore_index: int | None) -> Tensor:
    """int32 targets ``[H, W]``: the dataset's ignore value and values outside ``[0, C)`` → :data:`IGNORE`."""
    m = mask.int()
    bad = (m < 0) | (m >= num_classes)
    if ignore_index is not None:
        bad |= m == ignore_index
    return m.masked_fill(bad, IGNORE)


def keep_ratio_size(height: int, width: int, long_side: float, short_side: float) -> tuple[int, int]:
    """``(h, w)`` of an image scaled, keeping its ratio, as large as fits ``long_side × short_side``
    (mmcv's ``rescale_size``: factor ``min(long / max(h, w), short / min(h, w))``, rounded)."""
    factor = min(long_side / max(height, width), short_side / min(height, width))
    return max(1, int(height * factor + 0.5)), max(1, int(width * factor + 0.5))


def _resize_pair(image: Tensor, target: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Image bilinear (no antialiasing, as OpenCV's resize in MMSegmentation), labels nearest."""
    image = TF.resize(image, list(size), interpolation=InterpolationMode.BILINEAR, antialias=False)
    target = TF.resize(tv_tensors.Mask(target[None]), list(size), interpolation=NEAREST_EXACT)[0]
    return image, target.as_subclass(Tensor)


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def _coin(generator: torch.Generator) -> bool:
    return bool(torch.randint(2, (), generator=generator))


def scale_saturation(x: Tensor, factor: float) -> Tensor:
    """Multiply the HSV saturation of ``x`` (float RGB ``[3, H, W]``, any range) by ``factor``,
    clipped to 1, keeping hue and value: each channel moves towards the maximum,
    ``c' = V − (V − c) · min(factor, V / (V − min))``."""
    v, low = x.amax(0, keepdim=True), x.amin(0, keepdim=True)
    chroma = v - low
    gain = torch.minimum(torch.full_like(v, factor), v / chroma.clamp(min=1e-12))
    return torch.where(chroma > 0, v - (v - x) * gain, x)


def photometric_distortion(image: Tensor, generator: torch.Generator) -> Tensor:
    """MMSegmentation's ``PhotoMetricDistortion`` of a uint8 ``[3, H, W]`` image (module docs)."""
    x = image.float()
    if _coin(generator):
        x = (x + _uniform(-32, 32, generator)).clamp(0, 255)
    contrast_first = _coin(generator)

    def contrast(x: Tensor) -> Tensor:
        return (x * _uniform(0.5, 1.5, generator)).clamp(0, 255) if _coin(generator) else x

    if contrast_first:
        x = contrast(x)
    if _coin(generator):
        x = scale_saturation(x, _uniform(0.5, 1.5, generator)).clamp(0, 255)
    if _coin(generator):
        shift = int(torch.randint(-18, 18, (), generator=generator)) / 180
        x = adjust_hue(x[None] / 255, torch.tensor([shift]))[0].mul(255).clamp(0, 255)
    if not contrast_first:
        x = contrast(x)
    return x.round().to(torch.uint8)


def pad_to(image: Tensor, target: Tensor | None, height: int, width: int) -> tuple[Tensor, Tensor | None]:
    """Pad at the bottom / right to ``height × width``: mean colour, :data:`IGNORE` labels."""
    pad = [0, 0, width - image.shape[-1], height - image.shape[-2]]
    if not any(pad):
        return image, target
    image = TF.pad(image, pad, fill=MEAN_RGB)
    return image, None if target is None else TF.pad(target[None], pad, fill=IGNORE)[0]


@dataclass(frozen=True)
class ProbeAugmentation:
    """The paper's training augmentation at crop ``crop`` (module docs). Call with ``image``
    uint8 ``[3, H, W]``, ``target`` int32 ``[H, W]`` (:func:`training_targets`) and a generator;
    returns ``(image uint8 [3, crop, crop], target int32 [crop, crop])``."""

    crop: int
    ratio: tuple[float, float] = (0.5, 2.0)
    long_to_short: float = LONG_TO_SHORT  # the resize's long-side bound, × its short side (inf: none)
    cat_max_ratio: float = 0.75
    redraws: int = 10
    flip_p: float = 0.5
    photometric: bool = True

    def crop_box(self, target: Tensor, generator: torch.Generator) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of a crop where no class holds ``cat_max_ratio`` of the labels."""
        height, width = target.shape
        h, w = min(self.crop, height), min(self.crop, width)

        def draw() -> tuple[int, int, int, int]:
            top = int(torch.randint(height - h + 1, (), generator=generator))
            left = int(torch.randint(width - w + 1, (), generator=generator))
            return top, left, h, w

        box = draw()
        for _ in range(self.redraws if self.cat_max_ratio < 1 else 0):
            window = target[box[0] : box[0] + h, box[1] : box[1] + w]
            counts = torch.bincount(window[window != IGNORE].long().flatten())
            counts = counts[counts > 0]
            if len(counts) > 1 and counts.max() < self.cat_max_ratio * counts.sum():
                break
            box = draw()
        return box

    def __call__(self, image: Tensor, target: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        r = _uniform(*self.ratio, generator)
        size = keep_ratio_size(*image.shape[-2:], self.long_to_short * self.crop * r, self.crop * r)
        image, target = _resize_pair(image, target, size)
        top, left, h, w = self.crop_box(target, generator)
        image, target = image[:, top : top + h, left : left + w], target[top : top + h, left : left + w]
        if float(torch.rand((), generator=generator)) < self.flip_p:
            image, target = image.flip(-1), target.flip(-1)
        if self.photometric:
            image = photometric_distortion(image, generator)
        return pad_to(image.contiguous(), target.contiguous(), self.crop, self.crop)


def eval_view(image: Tensor, size: int, patch: int) -> tuple[Tensor, tuple[int, int]]:
    """The evaluation input of ``image`` (uint8 ``[3, H, W]``): scaled to fit ``(4·size, size)``,
    padded to whole patches; returns it and the scaled size ``(h, w)`` before padding."""
    h, w = keep_ratio_size(*image.shape[-2:], LONG_TO_SHORT * size, size)
    image = TF.resize(image, [h, w], interpolation=InterpolationMode.BILINEAR, antialias=False)
    padded, _ = pad_to(image, None, math.ceil(h / patch) * patch, math.ceil(w / patch) * patch)
    return padded, (h, w)
