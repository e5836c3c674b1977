"""Patch "encoders" without a network: the floors every trained feature is read against
(docs/evaluation.md, "Baselines").

A frozen network's patch tokens score something on the scenes even at random initialisation;
what that number means shows only beside what needs no training at all. Two such features,
each a module with the interface the frozen-feature evaluation reads (``patch_size``,
``embed_dim``, ``forward(normalised images) -> [B, h, w, D]``), so Hummingbird and the dense
linear probe run on them unchanged:

- :class:`PixelPatches`: the patch's own pixels, as the network sees them (after its input
  normalisation), flattened — what a network adds over its input;
- :class:`PatchPosition`: a one-hot of the patch's place in the token grid — how far the layout
  of the images alone goes (the position prior, ``locatdino.evaluation.hbird.position_prior``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PatchBaseline(nn.Module):
    """A network-free patch feature on a grid of ``patch_size`` px patches: no weights, so neither
    precision nor layer, final norm or PRR apply (``dense_features`` returns ``forward(x)``)."""

    def __init__(self, patch_size: int, embed_dim: int):
        super().__init__()
        if patch_size < 1:
            raise ValueError(f"patch size must be at least 1, got {patch_size}")
        self.patch_size, self.embed_dim = int(patch_size), int(embed_dim)

    def grid(self, x: Tensor) -> tuple[int, int]:
        """Token grid ``(h, w)`` of images ``x [B, 3, H, W]``; their sides must be multiples of the patch."""
        height, width = x.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(f"input {height}×{width} px is not a multiple of the patch size {self.patch_size}")
        return height // self.patch_size, width // self.patch_size


class PixelPatches(PatchBaseline):
    """Feature of a patch = its ``3 × p × p`` input values (channel-major, then rows, then columns)."""

    def __init__(self, patch_size: int):
        super().__init__(patch_size, 3 * patch_size * patch_size)

    def forward(self, x: Tensor) -> Tensor:
        h, w = self.grid(x)
        patches = F.unfold(x.float(), self.patch_size, stride=self.patch_size)  # [B, 3·p·p, h·w]
        return patches.transpose(1, 2).reshape(x.shape[0], h, w, self.embed_dim)


class PatchPosition(PatchBaseline):
    """Feature of a patch = the one-hot of its row-major index in a ``grid × grid`` token grid
    (``embed_dim = grid²``): patches at one place are identical, at two places orthogonal."""

    def __init__(self, patch_size: int, grid: int):
        super().__init__(patch_size, grid * grid)
        self.side = int(grid)

    def forward(self, x: Tensor) -> Tensor:
        h, w = self.grid(x)
        if (h, w) != (self.side, self.side):
            raise ValueError(
                f"input {tuple(x.shape[-2:])} px makes a {h}×{w} grid, this position feature is for "
                f"{self.side}×{self.side}"
            )
        one_hot = torch.eye(h * w, device=x.device).view(1, h, w, h * w)
        return one_hot.expand(x.shape[0], -1, -1, -1).clone()
