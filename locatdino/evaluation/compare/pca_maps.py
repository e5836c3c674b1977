"""PCA-to-RGB maps of patch features: the three leading principal components as colours.

The PCA (scikit-learn) is fitted per model on its memory's patch features, and each component is
scaled to [0, 1] between its 1st and 99th percentile over those features, so one model's maps of
different images share one colour code. A patch's colour is a function of its feature only:
patches with equal features get equal colours.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.decomposition import PCA


class PCAColours:
    """``fit(features [N, D])``, then ``rgb(features [..., D]) -> [..., 3]`` floats in [0, 1]."""

    def __init__(self, max_samples: int = 50_000, seed: int = 0):
        self.max_samples, self.seed = max_samples, seed

    def fit(self, features: np.ndarray) -> PCAColours:
        features = np.asarray(features, dtype=np.float32)
        if len(features) > self.max_samples:
            rows = np.random.default_rng(self.seed).choice(len(features), self.max_samples, replace=False)
            features = features[np.sort(rows)]
        self.pca = PCA(n_components=min(3, *features.shape), random_state=self.seed).fit(features)
        projected = self.pca.transform(features)
        self.lo, self.hi = np.percentile(projected, 1, axis=0), np.percentile(projected, 99, axis=0)
        return self

    def rgb(self, features: np.ndarray | torch.Tensor) -> np.ndarray:
        features = np.asarray(features, dtype=np.float32)
        projected = self.pca.transform(features.reshape(-1, features.shape[-1]))
        scaled = np.clip((projected - self.lo) / np.maximum(self.hi - self.lo, 1e-12), 0.0, 1.0)
        rgb = np.zeros((len(scaled), 3), dtype=np.float32)
        rgb[:, : scaled.shape[1]] = scaled
        return rgb.reshape(*features.shape[:-1], 3)


def upsample_nearest(patch_map: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``[h, w, C]`` patch map → ``[H, W, C]`` pixel map, each pixel taking its patch's value."""
    tensor = torch.from_numpy(np.ascontiguousarray(patch_map)).permute(2, 0, 1)[None].float()
    return F.interpolate(tensor, size=size, mode="nearest")[0].permute(1, 2, 0).numpy()
