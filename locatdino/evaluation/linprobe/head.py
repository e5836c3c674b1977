"""The paper's segmentation decoder on frozen patch tokens (docs/evaluation.md).

The official LocAtViT segmentation config (MMSegmentation) trains, on the frozen last-block patch
tokens, a 1×1 conv D → 512, a norm its config calls "LN" but which is ``nn.GroupNorm(1, 512)``:
*one* group, so each image is normalised over its channels and positions together (a per-pixel
LayerNorm would normalise over channels only), GELU, dropout 0, and a 1×1 conv 512 → classes. The
logits are bilinearly upsampled to the label size (``align_corners=False``, as MMSegmentation),
here as two small matrix products (:func:`bilinear_resize`): the same numbers as
``F.interpolate(mode="bilinear")``, whose CPU backward was a third of a probe's training step.

Initialisation as MMSegmentation's decode heads: the classifier conv ``N(0, 0.01)`` with zero
bias; the first conv PyTorch's default, without bias (the norm that follows removes any constant).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor, nn

HIDDEN = 512


class LinearSegHead(nn.Module):
    """``features [B, D, h, w] → logits [B, C, H, W]`` (``H, W = size``, or ``h, w`` when None).

    Args:
        in_dim: D, the backbone's embedding width.
        num_classes: C, the dataset's label values (an ignored value keeps its logit; see
            :func:`~locatdino.evaluation.linprobe.protocol.predict_labels`).
        hidden: width of the hidden 1×1 conv (512 in the paper).
        dropout: dropout before the classifier (0 in the paper).
    """

    def __init__(self, in_dim: int, num_classes: int, hidden: int = HIDDEN, dropout: float = 0.0):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, hidden, kernel_size=1, bias=False)
        self.norm = nn.GroupNorm(1, hidden)
        self.act = nn.GELU()
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.classifier = nn.Conv2d(hidden, num_classes, kernel_size=1)
        nn.init.normal_(self.classifier.weight, std=0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, features: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        logits = self.classifier(self.dropout(self.act(self.norm(self.proj(features)))))
        return logits if size is None else bilinear_resize(logits, size)


@lru_cache(maxsize=32)
def bilinear_weights(out_size: int, in_size: int) -> Tensor:
    """``[out, in]`` weights of 1-D linear interpolation with ``align_corners=False`` (PyTorch's
    rule for a target size: source ``(i + 0.5) · in / out − 0.5``, clamped at 0 and at the edge)."""
    src = ((torch.arange(out_size, dtype=torch.float64) + 0.5) * (in_size / out_size) - 0.5).clamp(min=0)
    low = src.floor().long().clamp(max=in_size - 1)
    high = (low + 1).clamp(max=in_size - 1)
    frac = src - low
    rows = torch.arange(out_size)
    weights = torch.zeros(out_size, in_size, dtype=torch.float64)
    weights.index_put_((rows, low), 1 - frac, accumulate=True)
    weights.index_put_((rows, high), frac, accumulate=True)
    return weights.float()


def bilinear_resize(x: Tensor, size: tuple[int, int]) -> Tensor:
    """``x [..., h, w] → [..., H, W]``, bilinear with ``align_corners=False``, as ``rows @ x @ colsᵀ``."""
    height, width = size
    if (height, width) == tuple(x.shape[-2:]):
        return x
    rows = bilinear_weights(height, x.shape[-2]).to(x.device, x.dtype)
    cols = bilinear_weights(width, x.shape[-1]).to(x.device, x.dtype)
    return rows @ x @ cols.T
