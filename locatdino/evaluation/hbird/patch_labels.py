"""Per-patch soft labels of segmentation masks (docs/evaluation.md).

Each memory patch carries the fraction of its pixels that belong to each class. Computed for a
whole batch with one ``torch.bincount`` over (image, patch, class) keys: no per-patch Python loop
and no ``[B, H, W, C]`` one-hot tensor (151 ADE20K classes at 448 px would make that 120 MB per
image).
"""

from __future__ import annotations

import torch
from torch import Tensor

from locatdino.evaluation.augment import PAD


def patch_class_counts(masks: Tensor, patch_size: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Count the pixels of each class inside every patch.

    Args:
        masks: ``[B, H, W]`` integer labels, ``H`` and ``W`` multiples of ``patch_size``. Values in
            ``[0, num_classes)`` are classes; :data:`PAD` marks padding; any other value (void,
            e.g. VOC's 255) counts as class 0, background — the reference's memory-building rule.
        patch_size: side of a square patch in pixels.
        num_classes: ``C``.

    Returns:
        ``counts [B, h*w, C]`` (int64, patches in row-major grid order) and ``valid [B, h*w]``
        (int64): the number of non-padding pixels of each patch.
    """
    if masks.dim() != 3:
        raise ValueError(f"masks must be [B, H, W], got shape {tuple(masks.shape)}")
    b, hh, ww = masks.shape
    p = patch_size
    if hh % p or ww % p:
        raise ValueError(f"mask size {hh}x{ww} is not a multiple of the patch size {p}")
    h, w = hh // p, ww // p
    m = masks.long()
    # Shift classes by one so that bin 0 of every patch collects the padding.
    bins = torch.where((m >= 0) & (m < num_classes), m + 1, 1)
    bins = torch.where(m == PAD, 0, bins)
    rows = torch.arange(hh, device=m.device) // p
    cols = torch.arange(ww, device=m.device) // p
    patch = (rows[:, None] * w + cols[None, :]).expand(b, hh, ww)
    image = torch.arange(b, device=m.device)[:, None, None] * (h * w)
    keys = (image + patch) * (num_classes + 1) + bins
    counts = torch.bincount(keys.reshape(-1), minlength=b * h * w * (num_classes + 1))
    counts = counts.view(b, h * w, num_classes + 1)
    return counts[..., 1:], p * p - counts[..., 0]


def soft_labels(counts: Tensor, valid: Tensor) -> Tensor:
    """Class fractions ``[..., C]`` (float32) from :func:`patch_class_counts`' outputs; rows sum
    to 1 wherever a patch has at least one valid pixel, 0 elsewhere."""
    return counts.float() / valid.clamp(min=1).unsqueeze(-1).float()
