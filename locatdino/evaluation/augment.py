"""Image preprocessing of frozen-backbone evaluation: ImageNet normalisation, the query resize and
Hummingbird's paired memory augmentation (docs/evaluation.md).

Memory images go through a random-resized crop of image *and* mask (scale (0.5, 2.0), aspect
(3/4, 4/3)) and mild colour jitter (brightness, contrast, saturation, hue 0.1, each applied with
p = 0.5, image only), then are resized to the input size.

What a scale above 1 means. The scale is the crop's area as a fraction of the image's. The
reference passes (0.5, 2.0) to torchvision's sampler, which cannot return a box larger than the
image and *rejects* such draws: for a 4:3 VOC image 83 % of its draws are rejected, the
effective range is (0.5, 1], and 15 % of views silently fall back to the whole image. Here a box that
overflows the image along a side is a zoom-out along that side instead: the whole image extent
there is shown smaller, at a random offset on a canvas filled with the ImageNet mean colour (0
after normalisation), and the canvas pixels get the mask value :data:`PAD`. Padding is
never a class: soft labels count image pixels only, and a patch that is mostly padding is not
stored. So the memory sees objects from twice to half their size, and only real pixels label it.

Three memory-view modes (``PairedAugmentation.mode``, ``locatdino hbird --augment``):

- ``"zoom-out"`` (default): the sampler above, plus colour jitter.
- ``"reference"``: the reference's sampler itself, torchvision's
  ``RandomResizedCrop.get_params`` (rejects boxes larger than the image, whole-image fallback),
  plus the same colour jitter; for reproducing published numbers.
- ``"off"``: the whole image resized to the input size, no jitter: every view of an image is the
  same, whatever the seed (the memory the reference builds with augmentation disabled).

Queries are only resized to the input size (the mask keeps its original resolution, see
:mod:`locatdino.evaluation.hbird.evaluate`). All randomness comes from an explicit ``torch.Generator``
so memory views are reproducible and identical for every model compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import InterpolationMode

# timm's ImageNet mean/std; the Hummingbird reference has 0.255 for the blue std: a typo of 0.225.
MEAN_RGB = [round(255 * m) for m in IMAGENET_DEFAULT_MEAN]
NEAREST_EXACT = InterpolationMode.NEAREST_EXACT
AUGMENT_MODES = ("zoom-out", "reference", "off")
PAD = -1
"""Mask value of canvas pixels that lie outside the source image (zoom-out crops). Never a class:
Hummingbird's soft labels (``locatdino.evaluation.hbird.patch_labels``) leave padded pixels out."""


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


@dataclass(frozen=True)
class PairedAugmentation:
    """Random-resized crop (zoom-out for scale > 1) of an image and its mask, plus colour jitter;
    ``mode`` picks the crop sampler or turns augmentation off (see the module docs).

    Call with ``image`` uint8 ``[3, H, W]``, ``mask`` integer ``[H, W]`` and a generator; returns
    ``(image uint8 [3, S, S], mask int32 [S, S])`` with ``S = size``.
    """

    size: int
    scale: tuple[float, float] = (0.5, 2.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    jitter: float = 0.1
    jitter_p: float = 0.5
    mode: str = "zoom-out"

    def __post_init__(self) -> None:
        if self.mode not in AUGMENT_MODES:
            raise ValueError(f"augmentation mode must be one of {AUGMENT_MODES}, got {self.mode!r}")

    def crop_box(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of the crop in image pixels; may extend beyond the image
        (``"zoom-out"`` only)."""
        if self.mode == "off":
            return 0, 0, height, width
        if self.mode == "reference":
            return self._reference_box(height, width, generator)
        area = height * width * _uniform(*self.scale, generator)
        aspect = math.exp(_uniform(math.log(self.ratio[0]), math.log(self.ratio[1]), generator))
        w = max(1, round(math.sqrt(area * aspect)))
        h = max(1, round(math.sqrt(area / aspect)))
        top = round(_uniform(0, height - h, generator))  # negative when h > height: zoom-out
        left = round(_uniform(0, width - w, generator))
        return top, left, h, w

    def _reference_box(self, height: int, width: int, generator: torch.Generator) -> tuple[int, int, int, int]:
        """torchvision's sampler, the one the reference calls, fed from ``generator``: it draws
        from the global RNG, so it runs on a forked global state seeded by one draw of ours."""
        seed = int(torch.randint(2**62, (), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return T.RandomResizedCrop.get_params(torch.empty(0, height, width), list(self.scale), list(self.ratio))

    def __call__(self, image: Tensor, mask: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        height, width = image.shape[-2:]
        top, left, h, w = self.crop_box(height, width, generator)
        pad = [max(0, -left), max(0, -top), max(0, left + w - width), max(0, top + h - height)]
        mask = tv_tensors.Mask(mask.int())
        if any(pad):  # zoom-out: put the image on a canvas of mean colour / PAD labels
            image = TF.pad(image, pad, fill=MEAN_RGB)
            mask = TF.pad(mask, pad, fill=PAD)
            top, left = top + pad[1], left + pad[0]
        size = [self.size, self.size]
        image = TF.resized_crop(image, top, left, h, w, size, antialias=True)
        # "nearest-exact" samples pixel centres like the bilinear image resize; torch's legacy
        # "nearest" (floor) shifts the mask by up to one source pixel against the image.
        # (torchvision's resized_crop ignores the interpolation of masks: crop, then resize).
        mask = TF.resize(TF.crop(mask, top, left, h, w), size, interpolation=NEAREST_EXACT)
        if self.mode == "off":
            return image, mask.as_subclass(Tensor)
        return self.color_jitter(image, generator), mask.as_subclass(Tensor)

    def color_jitter(self, image: Tensor, generator: torch.Generator) -> Tensor:
        """Brightness, contrast, saturation, hue, each with probability ``jitter_p`` (reference
        order), factors uniform in ``1 ± jitter`` (hue shift in ``± jitter``)."""
        j = self.jitter
        for adjust, low, high in (
            (TF.adjust_brightness, 1 - j, 1 + j),
            (TF.adjust_contrast, 1 - j, 1 + j),
            (TF.adjust_saturation, 1 - j, 1 + j),
            (TF.adjust_hue, -j, j),
        ):
            apply = float(torch.rand((), generator=generator)) < self.jitter_p
            factor = _uniform(low, high, generator)  # drawn always: same stream whatever applies
            if apply and j > 0:
                image = adjust(image, factor)
        return image


def resize_image(image: Tensor, size: int) -> Tensor:
    """Query preprocessing: uint8 ``[3, H, W]`` → ``[3, size, size]`` (bilinear, antialiased)."""
    return TF.resize(image, [size, size], antialias=True)


def normalize(images: Tensor) -> Tensor:
    """uint8 ``[B, 3, H, W]`` → float32 ImageNet-normalised (correct std, see module docs)."""
    mean = images.new_tensor(IMAGENET_DEFAULT_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = images.new_tensor(IMAGENET_DEFAULT_STD, dtype=torch.float32).view(1, 3, 1, 1)
    return (images.float() / 255.0 - mean) / std
