"""Budgeted memory: which patches of each image enter a memory of at most M patches (docs/evaluation.md).

With a budget M, N images and E augmentation epochs, every image view keeps exactly
``n = ⌊M / (N·E)⌋`` patches. The Hummingbird reference prefers patches of rare classes: a patch's
score is the sum, over the classes present in it, of the number of patches of the same image
containing that class; the score is multiplied by uniform noise and the ``n`` lowest are kept.
So a patch holding a class seen in few patches of its image is almost always kept, while the
large background regions are subsampled. Vectorised over the batch (one ``bmm`` and one
``topk``), unlike the reference's per-patch Python loops.

The noise comes from one seeded stream read in view order, ``P`` draws per view (:class:`ViewNoise`),
a view that does not decode included: view ``v`` always gets draws ``[v·P, (v + 1)·P)``, so a
contiguous share of the views (``locatdino.evaluation.ranks``) selects exactly the patches one
process selects for them, whatever the batches and the images that failed before it.
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


class ViewNoise:
    """The sampling noise of memory views ``start, start + 1, ...``: ``patches`` uniform draws per view
    from the stream of ``seed``, the draws of views before ``start`` skipped (torch's CPU generator
    draws element by element, so a ``[B, P]`` draw is ``B`` consecutive ``[P]`` draws)."""

    SKIP_CHUNK = 1 << 22  # draws skipped per call: bounds the scratch tensor at 16 MB

    def __init__(self, seed: int, patches: int, start: int = 0):
        self.generator, self.patches = torch.Generator().manual_seed(seed), patches
        for begin in range(0, start * patches, self.SKIP_CHUNK):
            torch.rand(min(self.SKIP_CHUNK, start * patches - begin), generator=self.generator)

    def next(self, present: Tensor) -> Tensor:
        """``[present.sum(), patches]``: the noise of the next ``len(present)`` views, rows of the
        views that decoded (``present``, bool) only; the others' draws are spent all the same."""
        return torch.rand((len(present), self.patches), generator=self.generator)[present]


def rare_class_first(
    counts: Tensor, keep: Tensor, n: int, generator: torch.Generator | None = None, noise: Tensor | None = None
) -> Tensor:
    """Select ``n`` patches per image, rare classes first.

    Args:
        counts: ``[B, P, C]`` pixel counts per patch and class
            (:func:`~locatdino.evaluation.hbird.patch_labels.patch_class_counts`).
        keep: ``[B, P]`` bool, the patches that may be stored at all (enough non-padding pixels).
        n: patches to keep per image.
        generator: source of the uniform noise (reproducible selections).
        noise: ``[B, P]`` the uniform noise itself (:class:`ViewNoise`), instead of ``generator``'s.

    Returns:
        ``[B, P]`` bool selection with exactly ``min(n, keep[b].sum())`` True per image ``b``.
    """
    presence = (counts > 0) & keep.unsqueeze(-1)
    presence = presence.float()
    class_patches = presence.sum(dim=1)  # [B, C]: patches of each image containing each class
    score = torch.bmm(presence, class_patches.unsqueeze(-1)).squeeze(-1)  # [B, P]
    if noise is None:
        noise = torch.rand(score.shape, generator=generator, device=score.device)
    score = torch.where(keep, score * noise, torch.inf)
    chosen = score.topk(min(n, score.shape[1]), dim=1, largest=False).indices
    selection = torch.zeros_like(keep).scatter_(1, chosen, True)
    return selection & keep
