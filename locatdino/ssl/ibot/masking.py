"""Block-wise masking of the student's global crops (BEiT's blocks, as iBOT and DINOv2 draw them; docs/pretraining.md).

A share of a batch's global crops gets a mask; each such crop's masked share is drawn in a ratio
range, spread evenly over the masked crops (DINOv2's collate), and reached by placing rectangular
blocks of at least ``min_patches`` patches with random aspect ratios until the crop's count is met.

Reproducible by construction: the masks of a step are a pure function of ``(seed, rank, step,
micro-batch)`` (:func:`mask_rng`), so a resumed run draws exactly the masks the uninterrupted one
would have, without keeping any generator state in the checkpoint, and the masks do not depend on
the number of data-loader workers (the references draw them in the workers' collate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def mask_rng(seed: int, rank: int, step: int, micro_batch: int) -> np.random.Generator:
    """The generator of one micro-batch's masks: one independent stream per (seed, rank, step,
    micro-batch), so every rank masks its own images differently and a resume replays them."""
    return np.random.default_rng([seed, rank, step, micro_batch])


@dataclass(frozen=True)
class BlockMasking:
    """Draws the masks of ``num_crops`` crops of one patch grid.

    Args:
        probability: share of the crops that get a mask (DINOv2 ``mask_sample_probability``
            0.5; iBOT's ``pred_ratio 0 0.3``: half of the images unmasked); the number of masked
            crops is ``int(num_crops × probability)``, as DINOv2's collate counts it.
        ratio: ``(low, high)``: the masked crops' target shares are drawn one from each of the
            equal sub-intervals of ``[low, high]`` (DINOv2: 0.1–0.5; iBOT: 0.3 ± 0.2).
        min_patches: smallest block, in patches (4).
        aspect: blocks' aspect ratios are log-uniform in ``[aspect, 1 / aspect]`` (0.3).
        attempts: tries to place one block before the crop keeps the patches it has.
    """

    probability: float = 0.5
    ratio: tuple[float, float] = (0.1, 0.5)
    min_patches: int = 4
    aspect: float = 0.3
    attempts: int = 10

    def __post_init__(self) -> None:
        low, high = self.ratio
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"mask_probability must be in [0, 1], got {self.probability}")
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"mask_ratio must be (low, high) with 0 <= low <= high <= 1, got {tuple(self.ratio)}")
        if self.min_patches < 1:
            raise ValueError(f"mask_min_patches must be at least 1, got {self.min_patches}")
        if not 0.0 < self.aspect <= 1.0:
            raise ValueError(f"mask_aspect_ratio must be in (0, 1], got {self.aspect}")

    def __call__(self, num_crops: int, grid: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
        """``[num_crops, h·w]`` bool, row-major over the grid (timm's token order); the masked
        crops are spread at random over the ``num_crops`` rows (view-major crops: any view)."""
        h, w = grid
        n_masked = int(num_crops * self.probability)
        edges = np.linspace(self.ratio[0], self.ratio[1], n_masked + 1)
        masks = np.zeros((num_crops, h * w), dtype=bool)
        for i in range(n_masked):
            target = int(h * w * rng.uniform(edges[i], edges[i + 1]))
            masks[i] = self.crop_mask(grid, target, rng).reshape(-1)
        return masks[rng.permutation(num_crops)]

    def crop_mask(self, grid: tuple[int, int], target: int, rng: np.random.Generator) -> np.ndarray:
        """``[h, w]`` bool with at most ``target`` patches masked: blocks are added, each covering
        at most the patches still missing, until the count is met or no block fits."""
        mask = np.zeros(grid, dtype=bool)
        count = 0
        while count < target:
            added = self._add_block(mask, target - count, rng)
            if added == 0:
                break
            count += added
        return mask

    def _add_block(self, mask: np.ndarray, budget: int, rng: np.random.Generator) -> int:
        """Mask one rectangle adding between 1 and ``budget`` new patches; the number added
        (0 when no try of :attr:`attempts` fits)."""
        h, w = mask.shape
        log_aspect = math.log(self.aspect)
        for _ in range(self.attempts):
            # uniform between the smallest block and the budget (which may be the smaller one)
            area = rng.uniform(min(self.min_patches, budget), max(self.min_patches, budget))
            aspect = math.exp(rng.uniform(log_aspect, -log_aspect))
            bh, bw = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if not (0 < bh < h and 0 < bw < w):  # smaller than the grid, as the references require
                continue
            top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            block = mask[top : top + bh, left : left + bw]
            new = bh * bw - int(block.sum())
            if 0 < new <= budget:
                block[...] = True
                return new
        return 0
