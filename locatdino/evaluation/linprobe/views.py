"""What the frozen backbone sees during the dense probe: training views and evaluation views.

Training runs a fixed number of iterations; :func:`draw_order` fixes, from the seed, which image
fills each slot of each batch (a fresh shuffle of the training set per epoch, as MMSegmentation's
infinite sampler), so the cached and the uncached path, any worker count and any device see the
same images in the same batches. Item ``k`` of :class:`TrainViews` is slot ``k`` of that order;
its augmentation draws from a generator of ``(seed, k)`` alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors

from locatdino.evaluation.augment import NEAREST_EXACT, resize_image
from locatdino.evaluation.linprobe.transforms import ProbeAugmentation, eval_view, training_targets
from locatdino.evaluation.views import load_pair, view_generator


def draw_order(num_images: int, iterations: int, batch_size: int, seed: int) -> np.ndarray:
    """``[iterations, batch_size]`` image indices: seeded permutations of the training set, one
    after another."""
    rng = np.random.default_rng(seed)
    need = iterations * batch_size
    epochs = -(-need // num_images)
    return np.concatenate([rng.permutation(num_images) for _ in range(epochs)])[:need].reshape(iterations, batch_size)


class TrainViews(Dataset):
    """Training views of ``dataset[order[k]]``: ``(image uint8 [3, S, S], target int32 [S, S])``,
    or None when the sample is corrupt. Without ``augmentation`` a view is the whole image
    resized to ``S × S`` (labels nearest), the same every time it is drawn."""

    def __init__(
        self, dataset: Any, order: np.ndarray, size: int, augmentation: ProbeAugmentation | None = None, seed: int = 0
    ):
        self.dataset, self.order, self.size = dataset, np.asarray(order).reshape(-1), size
        self.augmentation, self.seed = augmentation, seed

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor] | None:
        index = int(self.order[k])
        pair = load_pair(self.dataset, index)
        if pair is None:
            return None
        image, mask = pair
        target = training_targets(mask, self.dataset.num_classes, self.dataset.ignore_index)
        if self.augmentation is not None:
            return self.augmentation(image, target, view_generator(self.seed, k, index))
        size = [self.size, self.size]
        target = TF.resize(tv_tensors.Mask(target[None]), size, interpolation=NEAREST_EXACT)[0]
        return resize_image(image, self.size), target.as_subclass(Tensor)


class EvalViews(Dataset):
    """Evaluation views: ``(padded image uint8 [3, H', W'], scaled size (h, w), mask int32 [H, W]
    at original resolution)`` (:func:`~locatdino.evaluation.linprobe.transforms.eval_view`), or None when
    the sample is corrupt."""

    def __init__(self, dataset: Any, size: int, patch: int):
        self.dataset, self.size, self.patch = dataset, size, patch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, tuple[int, int], Tensor] | None:
        pair = load_pair(self.dataset, index)
        if pair is None:
            return None
        image, mask = pair
        return (*eval_view(image, self.size, self.patch), mask)


def collate_items(batch: list[Any]) -> tuple[list[Any], int]:
    """``(the non-None items, how many were None)``: corrupt samples are dropped and counted."""
    items = [b for b in batch if b is not None]
    return items, len(batch) - len(items)


def stack_pairs(items: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Training items → ``(images [B, 3, S, S], targets int64 [B, S, S])``."""
    return torch.stack([i for i, _ in items]), torch.stack([t for _, t in items]).long()
