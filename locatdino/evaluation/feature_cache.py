"""A feature extractor that computes each distinct batch once.

``locatdino compare`` scores every model at several memory sizes: the memory views and query
images are the same each time (views depend only on seed, epoch and image), so every run after
the first asks for exactly the batches of the first. Keyed by a hash of the batch's bytes, so a
different batch can never get stale features; bounded in bytes, past which it just computes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor


class CachedExtractor:
    """Wraps a :class:`~locatdino.evaluation.features.FeatureExtractor` (same interface)."""

    def __init__(self, extractor: Any, max_bytes: int = 1 << 30):
        self.extractor, self.max_bytes = extractor, max_bytes
        self.patch_size, self.device = extractor.patch_size, getattr(extractor, "device", torch.device("cpu"))
        self.precision = getattr(extractor, "precision", None)
        self._cache: dict[bytes, Tensor] = {}
        self.nbytes = 0
        self.hits = 0

    @property
    def dim(self) -> int:
        return self.extractor.dim

    def grid(self, size: int) -> int:
        return self.extractor.grid(size)

    def __call__(self, images: Tensor) -> Tensor:
        images = images.contiguous()
        key = hashlib.blake2b(images.numpy().tobytes(), digest_size=16).digest() + repr(tuple(images.shape)).encode()
        if key in self._cache:
            self.hits += 1
            return self._cache[key]
        feats = self.extractor(images)
        if self.nbytes + feats.nbytes <= self.max_bytes:
            self._cache[key] = feats
            self.nbytes += feats.nbytes
        return feats
