"""Every image's classifier input, computed once: the evaluation pass and the fast variant's training set.

``features [N, D]`` float32 with ``labels [N]`` and ``filled [N]`` (False for an image that did not
decode), in RAM up to ``max_ram_bytes`` and memory-mapped in a temporary folder otherwise
(ImageNet's 1.28 M training images × 1,536 values of ViT-S's four class tokens are 7.9 GB), with
the disk space claimed before the first image is encoded and the folder deleted by :meth:`close`
(or, after a killed run, by the next cache made in the same place).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from locatdino.common.output_files import feature_rows
from locatdino.evaluation.ranks import gather_rows


class ClassFeatures:
    """``features [N, D]``, ``labels [N]`` and ``filled [N]`` of ``N`` images, filled by :meth:`put`."""

    def __init__(self, count: int, dim: int, directory: str | Path | None = None, max_ram_bytes: int = 4 << 30):
        self._rows = contextlib.ExitStack()
        self.features = self._rows.enter_context(feature_rows(count, dim, directory, max_ram_bytes, "lincls-features"))
        self.labels = np.full(count, -1, np.int64)
        self.filled = np.zeros(count, bool)

    def put(self, indices: Tensor, features: Tensor, labels: Tensor) -> None:
        idx = indices.numpy()
        self.features[idx] = features.float().cpu().numpy()
        self.labels[idx] = labels.numpy()
        self.filled[idx] = True

    def share_rows(self, share: range) -> None:
        """Fill every rank's store with every rank's rows ``share`` (its contiguous share of the
        images, ``locatdino.evaluation.ranks``): after it each store holds all images; one process: nothing to do."""
        for array in (self.features, self.labels, self.filled):
            gather_rows(array[share.start : share.stop], out=array)

    def usable(self) -> np.ndarray:
        """Indices of the images that decoded, ascending."""
        return np.flatnonzero(self.filled)

    def rows(self, indices: np.ndarray, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Features and labels of images ``indices`` (any order)."""
        feats = torch.from_numpy(np.ascontiguousarray(self.features[indices]))
        return feats.to(device), torch.from_numpy(self.labels[indices]).to(device)

    def close(self) -> None:
        self.features = None
        self._rows.close()
