"""DINO multi-crop augmentation (docs/pretraining.md) and the batch collation the DINO module consumes.

Reference recipe (Caron et al. 2021, ``main_dino.py: DataAugmentationDINO``): 2 global crops
(224 px, RandomResizedCrop scale (0.4, 1), bicubic) and N local crops (96 px, scale
(0.05, 0.4)); every crop: horizontal flip p 0.5, ColorJitter(0.4, 0.4, 0.2, 0.1) p 0.8,
grayscale p 0.2; global crop 1: Gaussian blur p 1.0, global crop 2: blur p 0.1 and solarize
p 0.2, local crops: blur p 0.5; blur sigma U(0.1, 2); ImageNet normalisation.

Where the time goes and how it is kept low: the image is converted to a uint8 tensor once; each
crop is cut and resized on uint8 (torchvision's SIMD bicubic path, ~3× faster than PIL); the crops
of one resolution are stacked in small chunks, converted to float once, and every photometric op
runs on a chunk with per-crop parameters (``locatdino.data.transforms.photometric``: float-only hue,
separable blur); the result is normalised straight into the output stack. With the shard loader it
feeds 1.55× the images/s of an ``ImageFolder`` with the reference PIL transform (benchmarks/RESULTS.md,
"How fast is data loading?").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import default_collate
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from locatdino.data.transforms import photometric as P

# Crops are augmented in equal chunks of at most this many pixels (a 224 px global crop alone,
# 8 local 96 px crops as 2 × 4): the float working set of a chunk and its temporaries stays small
# and cache-friendly, which makes the memory-bound photometric ops ~5 % faster than on the whole
# stack at once.
_CHUNK_PIXELS = 65_536


def to_uint8_rgb(image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[3, H, W]`` uint8 from a PIL image (any mode), an HWC uint8 array or a CHW uint8 tensor."""
    if isinstance(image, Image.Image):
        return TF.pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))
    if isinstance(image, np.ndarray):
        image = (
            torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
            if image.ndim == 3
            else (torch.from_numpy(np.ascontiguousarray(image))[None])
        )
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected a uint8 image [3, H, W] or [1, H, W], got {image.dtype} {tuple(image.shape)}")
    return image.expand(3, -1, -1) if image.shape[0] == 1 else image


@dataclass
class MultiCropTransform:
    """One image → ``num_global_crops`` global crops then ``num_local_crops`` local crops.

    ``__call__`` returns a list of float tensors ``[3, S, S]`` (normalised), globals first.
    ``global_blur_prob`` / ``global_solarize_prob`` give one probability per global crop;
    ``global_crop_scale`` defaults to (0.4, 1) with local crops and (0.14, 1) without (DINO).
    A dataclass, so LightningCLI/jsonargparse configure it as a nested group
    (``--data.multicrop.num_local_crops 6``).
    """

    global_crop_size: int = 224
    local_crop_size: int = 96
    num_global_crops: int = 2
    num_local_crops: int = 8
    global_crop_scale: tuple[float, float] | None = None
    local_crop_scale: tuple[float, float] = (0.05, 0.4)
    flip_prob: float = 0.5
    color_jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)
    color_jitter_prob: float = 0.8
    grayscale_prob: float = 0.2
    global_blur_prob: tuple[float, ...] = (1.0, 0.1)
    global_solarize_prob: tuple[float, ...] = (0.0, 0.2)
    local_blur_prob: float = 0.5
    local_solarize_prob: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD

    def __post_init__(self) -> None:
        for name in ("global_blur_prob", "global_solarize_prob"):
            if len(getattr(self, name)) != self.num_global_crops:
                raise ValueError(
                    f"MultiCropTransform: {name} needs one probability per global crop "
                    f"({self.num_global_crops}), got {getattr(self, name)}"
                )
        if self.num_global_crops < 1 or self.num_local_crops < 0:
            raise ValueError("MultiCropTransform: need >= 1 global crop and >= 0 local crops")
        bicubic = v2.InterpolationMode.BICUBIC
        self._global_crop = v2.RandomResizedCrop(
            self.global_crop_size, self.global_scale, interpolation=bicubic, antialias=True
        )
        self._local_crop = v2.RandomResizedCrop(
            self.local_crop_size, tuple(self.local_crop_scale), interpolation=bicubic, antialias=True
        )
        self._mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        self._std = torch.tensor(self.std).view(1, 3, 1, 1)

    @property
    def global_scale(self) -> tuple[float, float]:
        """The global crops' area range: ``global_crop_scale`` or DINO's default."""
        return tuple(self.global_crop_scale or ((0.4, 1.0) if self.num_local_crops else (0.14, 1.0)))

    def __call__(self, image: Image.Image | np.ndarray | torch.Tensor) -> list[torch.Tensor]:
        x = to_uint8_rgb(image)
        crops = list(
            self._views(
                x,
                self._global_crop,
                self.num_global_crops,
                torch.tensor(self.global_blur_prob),
                torch.tensor(self.global_solarize_prob),
            )
        )
        if self.num_local_crops:
            n = self.num_local_crops
            crops += self._views(
                x,
                self._local_crop,
                n,
                torch.full((n,), self.local_blur_prob),
                torch.full((n,), self.local_solarize_prob),
            )
        return crops

    def _views(
        self, x: torch.Tensor, crop: v2.RandomResizedCrop, n: int, blur_p: torch.Tensor, solarize_p: torch.Tensor
    ) -> torch.Tensor:
        """``n`` augmented crops of one size as a stack ``[n, 3, S, S]`` (normalised float)."""
        flip = (torch.rand(n) < self.flip_prob).tolist()
        crops = [crop(x).flip(-1) if f else crop(x) for f in flip]
        jitter, factors = torch.rand(n) < self.color_jitter_prob, self._jitter_factors(n)
        # one random op order per crop size and image: each crop's order is uniform, as in ColorJitter
        order = torch.randperm(4).tolist()
        gray = torch.rand(n) < self.grayscale_prob
        blur, sigma = torch.rand(n) < blur_p, torch.empty(n).uniform_(*self.blur_sigma)
        sol = torch.rand(n) < solarize_p
        out = torch.empty(n, *crops[0].shape)
        step = math.ceil(n / math.ceil(n * crops[0][0].numel() / _CHUNK_PIXELS))  # equal chunks
        for i in range(0, n, step):
            part = slice(i, i + step)
            views = torch.stack(crops[part]).float().div_(255)
            views = _apply(views, jitter[part], lambda v, f: P.color_jitter(v, f, order), factors[part])
            views = _apply(views, gray[part], P.grayscale)
            views = _apply(views, blur[part], P.gaussian_blur, sigma[part])
            views = _apply(views, sol[part], P.solarize)
            torch.sub(views, self._mean, out=out[part]).div_(self._std)
        return out

    def _jitter_factors(self, n: int) -> torch.Tensor:
        """``[n, 4]`` factors drawn as ColorJitter does: U(max(0, 1 − v), 1 + v), hue U(−h, h)."""
        b, c, s, h = self.color_jitter
        lo = torch.tensor([max(0.0, 1 - b), max(0.0, 1 - c), max(0.0, 1 - s), -h])
        hi = torch.tensor([1 + b, 1 + c, 1 + s, h])
        return lo + (hi - lo) * torch.rand(n, 4)


def _apply(
    views: torch.Tensor, selected: torch.Tensor, op: Callable[..., torch.Tensor], *params: torch.Tensor
) -> torch.Tensor:
    """``views`` with ``op(views[i], *params[i])`` applied to the selected crops: the op's own
    output when all are selected (no gather, no copy back), else written back in place."""
    if bool(selected.all()):
        return op(views, *params)
    if bool(selected.any()):
        idx = selected.nonzero().flatten()
        views.index_copy_(0, idx, op(views.index_select(0, idx), *(p[idx] for p in params)))
    return views


def _stack_views(samples: Sequence[Sequence[torch.Tensor]], start: int, stop: int) -> torch.Tensor:
    """Crops ``start:stop`` of every sample as ``[V, B, ...]``. ``default_collate`` stacks straight
    into shared memory inside a DataLoader worker, saving the copy that sending the batch would cost."""
    flat = default_collate([s[v] for v in range(start, stop) for s in samples])
    return flat.view(stop - start, len(samples), *flat.shape[1:])


def collate_multicrop(
    samples: Sequence[Sequence[torch.Tensor]], skipped: int | None = None, num_global_crops: int | None = None
) -> dict[str, torch.Tensor]:
    """Stack per-sample crop lists into the DINO batch (INTERFACES.md).

    Returns ``{"global": [V_g, B, 3, H, W], "local": [V_l, B, 3, h, w]}`` (view-major, so the
    crops of one resolution go through the backbone in one forward as ``flatten(0, 1)``), plus
    ``"skipped"`` (int64 scalar) when given. ``num_global_crops`` defaults to the leading run of
    crops with the size of the first one.
    """
    if not samples:
        raise ValueError("collate_multicrop: empty batch")
    first = samples[0]
    if num_global_crops is None:
        num_global_crops = next((i for i, c in enumerate(first) if c.shape != first[0].shape), len(first))
    glob = _stack_views(samples, 0, num_global_crops)
    loc = (
        _stack_views(samples, num_global_crops, len(first))
        if len(first) > num_global_crops
        else (glob.new_empty((0, len(samples), 3, 0, 0)))
    )
    batch = {"global": glob, "local": loc}
    if skipped is not None:
        batch["skipped"] = torch.tensor(skipped, dtype=torch.int64)
    return batch
