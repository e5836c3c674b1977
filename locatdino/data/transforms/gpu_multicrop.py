"""DINO multi-crop on the training device: whole batches, one random draw per crop.

``augment_on: gpu`` moves the augmentation of :class:`~locatdino.data.MultiCropTransform` out of
the DataLoader workers: they only decode (``locatdino.data.transforms.decoded_images``), and
:class:`GPUMultiCrop` turns a batch of uint8 ``[B, 3, S, S]`` images into the DINO batch
``{"global": [V_g, B, 3, G, G], "local": [V_l, B, 3, L, L]}`` on whatever device the batch is on,
with the same distributions as the CPU path (``tests/data/transforms/test_gpu_multicrop.py`` compares them
over thousands of draws):

- **crop boxes**: :func:`sample_crop_boxes`, torchvision's ``RandomResizedCrop`` algorithm (10
  tries of area × log-uniform aspect, then the centre fallback) for all crops at once, in each
  image's *decoded* pixels; the boxes are mapped onto the stored ``S × S`` grid and cut and resized
  by ``torchvision.ops.roi_align`` (one kernel for every crop; ``sampling_ratio=-1`` averages
  ``ceil(box / output)`` bilinear samples per output pixel, an area filter where a crop shrinks:
  antialiased like the CPU path's bicubic, a different kernel);
- **flip, colour jitter, grayscale, Gaussian blur, solarisation, normalisation**: kornia's
  augmentation modules (``kornia.augmentation``), which draw every parameter and every
  apply-or-not per sample. One pipeline per global view (its own blur / solarisation
  probabilities) and one for all local crops.

Chosen over NVIDIA DALI because kornia is a pip package that runs on CPU tensors too (so the path
is tested on the CPU-only machines, CI included) and composes with plain torch; DALI's GPU JPEG
decoder and WebDataset reader need a CUDA build and its own pipeline and loader, which a CPU-only
machine can neither install nor measure. Known differences from the CPU path, none in a distribution the tests check:
kornia draws one colour-jitter op order per call (per view group and batch; the CPU path one per
image and crop size; either way each crop's order is uniform over the 24); the resize kernel is
bilinear / area rather than bicubic; the image is resampled once to ``S × S`` before cropping.

Randomness: ``GPUMultiCrop(images, sizes, seed=k)`` draws from a forked RNG seeded with ``k``
(CPU and the batch's CUDA device), so a batch's crops are a function of ``k`` alone and training's
own RNG stream is untouched; ``ShardDataModule`` passes a seed made of its ``seed``, the rank and
a batch counter kept in its checkpointed state, so DDP ranks differ and a resumed run continues.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn
from torchvision.ops import roi_align

from locatdino.data.transforms.multicrop import MultiCropTransform

ASPECT_RATIO = (3 / 4, 4 / 3)  # RandomResizedCrop's default, the CPU path's
_TRIES = 10
_SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize at 128, the CPU path's


def sample_crop_boxes(sizes: Tensor, n: int, scale: Sequence[float], ratio: Sequence[float] = ASPECT_RATIO) -> Tensor:
    """``n`` RandomResizedCrop boxes for each of ``B`` images of ``sizes [B, 2]`` ``(h, w)``.

    torchvision's ``RandomResizedCrop.make_params`` for every crop at once: up to 10 tries of
    ``area × U(scale)`` and ``exp(U(log ratio))``, rounded to whole pixels, the first that fits
    wins and is placed uniformly; else the centre crop of the ratio-clamped image. Returns
    ``[n · B, 4]`` float ``(top, left, height, width)`` in pixels, view-major (box ``v · B + b``
    belongs to image ``b``), drawn on ``sizes.device`` from the global RNG.
    """
    hw = sizes.to(torch.float64).repeat(n, 1)
    height, width = hw[:, 0:1], hw[:, 1:2]
    shape = (hw.shape[0], _TRIES)
    area = height * width * torch.empty(shape, dtype=torch.float64, device=sizes.device).uniform_(*scale)
    log_r = torch.empty(shape, dtype=torch.float64, device=sizes.device).uniform_(
        math.log(ratio[0]), math.log(ratio[1])
    )
    w = torch.sqrt(area * log_r.exp()).round()
    h = torch.sqrt(area / log_r.exp()).round()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(fits, torch.arange(_TRIES, device=sizes.device), _TRIES).amin(1, keepdim=True)
    found = first.squeeze(1) < _TRIES
    first = first.clamp(max=_TRIES - 1)
    h, w = h.gather(1, first).squeeze(1), w.gather(1, first).squeeze(1)
    height, width = height.squeeze(1), width.squeeze(1)
    # the fallback: the largest centred crop whose aspect ratio is within `ratio`
    in_ratio = width / height
    fall_w = torch.where(in_ratio > ratio[1], (height * ratio[1]).round(), width)
    fall_h = torch.where(in_ratio < ratio[0], (width / ratio[0]).round(), height)
    h, w = torch.where(found, h, fall_h), torch.where(found, w, fall_w)
    u = torch.rand(hw.shape[0], 2, dtype=torch.float64, device=sizes.device)
    top = torch.where(found, (u[:, 0] * (height - h + 1)).floor().clamp(max=height - h), ((height - h) / 2).floor())
    left = torch.where(found, (u[:, 1] * (width - w + 1)).floor().clamp(max=width - w), ((width - w) / 2).floor())
    return torch.stack([top, left, h, w], 1)


def cut_crops(images: Tensor, sizes: Tensor, boxes: Tensor, out: int) -> Tensor:
    """Crops ``[n · B, 3, out, out]`` (float, the images' value range) of ``images [B, 3, S_h, S_w]``
    stored at ``S_h × S_w`` from decoded ``sizes [B, 2]``, boxes from :func:`sample_crop_boxes`."""
    batch = images.shape[0]
    n = boxes.shape[0] // batch
    hw = sizes.to(boxes.dtype).repeat(n, 1)
    sy, sx = images.shape[-2] / hw[:, 0], images.shape[-1] / hw[:, 1]
    top, left, h, w = boxes.unbind(1)
    index = torch.arange(batch, device=boxes.device, dtype=boxes.dtype).repeat(n)
    rois = torch.stack([index, left * sx, top * sy, (left + w) * sx, (top + h) * sy], 1)
    source = images if images.is_floating_point() else images.float()
    return roi_align(source, rois.to(source.dtype), (out, out), spatial_scale=1.0, sampling_ratio=-1, aligned=True)


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """The global RNG of the CPU and of ``device`` (CUDA) forked and seeded with ``seed``."""
    cuda = device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else [], device_type="cuda"):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


class GPUMultiCrop(nn.Module):
    """The DINO multi-crop of ``multicrop`` (its sizes, scales and probabilities) on whole batches.

    ``forward(images, sizes, seed=None)``: uint8 ``[B, 3, S, S]`` images (any device) and their
    decoded sizes ``[B, 2]`` → ``{"global": [V_g, B, 3, G, G], "local": [V_l, B, 3, L, L]}``
    float32, normalised, exactly the CPU path's batch layout (``collate_multicrop``).
    """

    def __init__(self, multicrop: MultiCropTransform) -> None:
        super().__init__()
        self.multicrop = m = multicrop
        self.global_views = nn.ModuleList(
            self._pipeline(m.global_crop_size, blur, sol)
            for blur, sol in zip(m.global_blur_prob, m.global_solarize_prob)
        )
        self.local_views = self._pipeline(m.local_crop_size, m.local_blur_prob, m.local_solarize_prob)

    def _pipeline(self, size: int, blur_prob: float, solarize_prob: float) -> nn.Sequential:
        import kornia.augmentation as K  # noqa: N812 (kornia's own idiom); only the GPU path needs it

        m = self.multicrop
        ops: list[nn.Module] = [K.RandomHorizontalFlip(p=m.flip_prob)] if m.flip_prob > 0 else []
        if m.color_jitter_prob > 0 and any(m.color_jitter):
            ops.append(K.ColorJitter(*m.color_jitter, p=m.color_jitter_prob))
        if m.grayscale_prob > 0:
            ops.append(K.RandomGrayscale(p=m.grayscale_prob))
        if blur_prob > 0:
            # radius 3 sigma (the CPU path's), at most the crop side - 1 (reflect padding)
            radius = min(math.ceil(3 * m.blur_sigma[1]), size - 1)
            ops.append(K.RandomGaussianBlur(2 * radius + 1, tuple(m.blur_sigma), border_type="reflect", p=blur_prob))
        if solarize_prob > 0:
            ops.append(K.RandomSolarize(thresholds=(_SOLARIZE_THRESHOLD,) * 2, additions=0.0, p=solarize_prob))
        ops.append(K.Normalize(mean=torch.tensor(m.mean), std=torch.tensor(m.std)))
        return nn.Sequential(*ops)

    def forward(self, images: Tensor, sizes: Tensor, seed: int | None = None) -> dict[str, Tensor]:
        if images.ndim != 4 or images.shape[1] != 3 or sizes.shape != (images.shape[0], 2):
            raise ValueError(
                f"GPUMultiCrop: expected images [B, 3, S, S] and sizes [B, 2], got "
                f"{tuple(images.shape)} and {tuple(sizes.shape)}"
            )
        with seeded_rng(seed, images.device) if seed is not None else contextlib.nullcontext():
            return self._augment(images, sizes)

    def _augment(self, images: Tensor, sizes: Tensor) -> dict[str, Tensor]:
        m, batch = self.multicrop, images.shape[0]
        source = images.float()
        glob = self._views(source, sizes, len(self.global_views), m.global_scale, m.global_crop_size)
        glob = torch.stack([view(g) for view, g in zip(self.global_views, glob.unbind(0))])
        if m.num_local_crops:
            loc = self._views(source, sizes, m.num_local_crops, m.local_crop_scale, m.local_crop_size)
            loc = self.local_views(loc.flatten(0, 1)).unflatten(0, (m.num_local_crops, batch))
        else:
            loc = glob.new_empty((0, batch, 3, 0, 0))
        return {"global": glob, "local": loc}

    @staticmethod
    def _views(source: Tensor, sizes: Tensor, n: int, scale: Sequence[float], out: int) -> Tensor:
        """``n`` crops of every image, ``[n, B, 3, out, out]`` in [0, 1]."""
        crops = cut_crops(source, sizes, sample_crop_boxes(sizes, n, scale), out).mul_(1 / 255)
        return crops.unflatten(0, (n, source.shape[0]))
