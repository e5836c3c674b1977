"""The loader's half of the GPU multi-crop: every image decoded and resized to one fixed square.

With ``augment_on: gpu`` the DataLoader workers only decode: each image becomes a uint8
``[3, S, S]`` tensor (resized without keeping its aspect ratio, so every pixel is kept and a
batch stacks) plus its decoded size ``(h, w)``. The device side
(:class:`locatdino.data.transforms.gpu_multicrop.GPUMultiCrop`) samples the crop boxes in the decoded
image's own pixels — so scale and aspect ratio mean what they mean on the CPU path — and maps them
onto the ``S × S`` grid. ``S`` defaults to the side at which the smallest global crop is cut at its
output resolution (:func:`default_image_size`); a JPEG larger than needed is decoded at a reduced
scale by libjpeg itself (``decode_rgb(draft=...)``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms.v2 import functional as TF

from locatdino.data.transforms.decode import decode_rgb
from locatdino.data.transforms.multicrop import MultiCropTransform, to_uint8_rgb


def default_image_size(multicrop: MultiCropTransform) -> int:
    """``ceil(global_crop_size / sqrt(min global scale))`` rounded up to a multiple of 16: the
    smallest global crop then spans at least its output size on the stored grid (368 px for
    224 px crops at scale ≥ 0.4, 112 px for 64 px crops)."""
    side = multicrop.global_crop_size / math.sqrt(multicrop.global_scale[0])
    return 16 * math.ceil(side / 16)


def check_decoded_size(size: int, multicrop: MultiCropTransform) -> int:
    """``size`` if it is at least the largest crop, else ``ValueError`` naming ``decoded_size``,
    the crop and both sizes: every crop would be upsampled from fewer pixels than it has (0 or a
    negative size is not "the default": that is ``null``)."""
    crops = [("global_crop_size", multicrop.global_crop_size)]
    if multicrop.num_local_crops:
        crops.append(("local_crop_size", multicrop.local_crop_size))
    name, largest = max(crops, key=lambda c: c[1])
    if size < largest:
        raise ValueError(
            f"decoded_size {size} px is smaller than the largest crop (multicrop.{name} {largest} px): "
            f"give at least {largest}, or leave it null for the default {default_image_size(multicrop)} px"
        )
    return size


@dataclass(frozen=True)
class DecodedImage:
    """Image → ``(uint8 [3, size, size], int64 [2] decoded (h, w))``; ``decode`` is the stream's
    bytes → PIL step with libjpeg's reduced-scale decoding down to ``size``."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"DecodedImage: size must be >= 1, got {self.size}")

    @property
    def decode(self) -> Callable[[bytes], Image.Image]:
        return functools.partial(decode_rgb, draft=(self.size, self.size))

    def __call__(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        x = to_uint8_rgb(image)
        hw = torch.tensor(x.shape[-2:], dtype=torch.int64)
        if tuple(x.shape[-2:]) != (self.size, self.size):
            # torchvision's uint8 SIMD path: ~7x faster than PIL's resize at 500x375 -> 368 px
            x = TF.resize(x, [self.size, self.size], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
        return x, hw


def collate_decoded(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``(image, size)`` pairs → ``{"images": uint8 [B, 3, S, S], "sizes": int64 [B, 2]}``, stacked
    straight into shared memory inside a worker (``default_collate``)."""
    images, sizes = default_collate(list(items))
    return {"images": images, "sizes": sizes}
