"""Budgeted memory: which patches of each image enter a memory of at most M patches (docs/evaluation.md).

With a budget M, N images and E augmentation epochs, every image view keeps exactly
``n = ⌊M / (N·E)⌋`` patches. The Hummingbird reference prefers patches of rare classes: a patch's
score is the sum, over the classes present in it, of the number of patches of the same image
containing that class; the score is multiplied by uniform noise and the ``n`` lowest are kept.
So a patch holding a class seen in few patches of its image is almost always kept, while the
large background regions are subsampled. Vectorised over the batch (one ``bmm`` and one
``topk``), unlike the reference's per-patch Python loops.
"""

from __future__ import annotations

import torch
from torch import Tensor


def patches_per_image(memory_size: int, num_images: int, aug_epochs: int) -> int:
    """``⌊M / (N·E)⌋``, the number of patches each image view contributes to a budgeted memory."""
    n = memory_size // (num_images * aug_epochs)
    if n < 1:
        raise ValueError(
            f"memory size {memory_size} is smaller than one patch per image view "
            f"({num_images} images x {aug_epochs} augmentation epochs)"
        )
    return n


def rare_class_first(counts: Tensor, keep: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
    """Select ``n`` patches per image, rare classes first.

    Args:
        counts: ``[B, P, C]`` pixel counts per patch and class
            (:func:`~locatdino.evaluation.hbird.patch_labels.patch_class_counts`).
        keep: ``[B, P]`` bool, the patches that may be stored at all (enough non-padding pixels).
        n: patches to keep per image.
        generator: source of the uniform noise (reproducible selections).

    Returns:
        ``[B, P]`` bool selection with exactly ``min(n, keep[b].sum())`` True per image ``b``.
    """
    presence = (counts > 0) & keep.unsqueeze(-1)
    presence = presence.float()
    class_patches = presence.sum(dim=1)  # [B, C]: patches of each image containing each class
    score = torch.bmm(presence, class_patches.unsqueeze(-1)).squeeze(-1)  # [B, P]
    noise = torch.rand(score.shape, generator=generator, device=score.device)
    score = torch.where(keep, score * noise, torch.inf)
    chosen = score.topk(min(n, score.shape[1]), dim=1, largest=False).indices
    selection = torch.zeros_like(keep).scatter_(1, chosen, True)
    return selection & keep
