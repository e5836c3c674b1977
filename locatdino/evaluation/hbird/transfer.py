"""Label transfer: class scores of query patches from their retrieved neighbours (docs/evaluation.md).

Each query patch attends over its k nearest memory patches with weights
``softmax(cos / β)`` (β = 0.02, i.e. a temperature that makes the nearest few neighbours
dominate) and takes the weighted sum of their soft labels. The per-patch class scores are then
upsampled bilinearly to pixel resolution and the argmax is the predicted class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def transfer_labels(sims: Tensor, neighbour_labels: Tensor, beta: float = 0.02) -> Tensor:
    """Weighted soft-label vote.

    Args:
        sims: ``[n, k]`` cosine similarities of each query patch to its neighbours; ``-inf`` (or
            FAISS' ``-3.4e38``) for missing neighbours, which then get zero weight.
        neighbour_labels: ``[n, k, C]`` soft labels of those neighbours.
        beta: softmax temperature.

    Returns:
        ``[n, C]`` class scores (each row sums to 1 when the neighbours' labels do); all zeros for
        a query with no neighbour at all.
    """
    if sims.shape != neighbour_labels.shape[:2]:
        raise ValueError(f"sims {tuple(sims.shape)} and neighbour labels {tuple(neighbour_labels.shape)} disagree")
    weights = torch.softmax(sims.float() / beta, dim=-1).nan_to_num(0.0)
    return torch.einsum("nk,nkc->nc", weights, neighbour_labels.float())


def upsample_scores(scores: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear upsampling of class scores ``[B, C, h, w]`` to ``[B, C, H, W]`` — the reference's
    ``F.interpolate(mode="bilinear")`` (``align_corners=False``)."""
    return F.interpolate(scores, size=size, mode="bilinear", align_corners=False)


def predict(scores: Tensor, size: tuple[int, int]) -> Tensor:
    """Predicted classes ``[B, H, W]`` (int64) from patch-grid class scores ``[B, C, h, w]``."""
    return upsample_scores(scores, size).argmax(dim=1)
