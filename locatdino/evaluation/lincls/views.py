"""The images of linear classification: DINO's training augmentation and its evaluation crop.

Training (the reference's ``eval_linear``): torchvision's ``RandomResizedCrop(S)`` (scale
(0.08, 1), bilinear) and a horizontal flip with p = 0.5, then ImageNet mean / std. torchvision's,
not timm's: they draw from torch's RNG, so ``--seed`` fixes them (timm's crop draws from Python's
``random``). Evaluation, and every image of the cached-feature variant: the k-NN evaluation's
view (:func:`~locatdino.evaluation.class_features.eval_transform`: short side to ``S · 256 / 224``,
bicubic, centre crop ``S``, the reference's Resize(256) + CenterCrop(224)).

Datasets give ``ds[i] -> (PIL image, class index)`` (:mod:`locatdino.evaluation.class_splits`). A
sample that does not decode is skipped; :func:`collate_views` counts it and keeps its index, so
the run can name it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchvision.transforms as T
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torch.utils.data import Dataset


def train_transform(size: int) -> Callable[[Any], Tensor]:
    """DINO's linear-evaluation training augmentation: PIL image → normalised ``[3, S, S]``."""
    return T.Compose(
        [
            T.RandomResizedCrop(size),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
        ]
    )


class ClassViews(Dataset):
    """``(view [3, S, S], class index, dataset index)`` of ``dataset[i]`` through ``transform``;
    ``(None, None, i)`` when the image does not decode."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Tensor]):
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor | None, int | None, int]:
        try:
            image, label = self.dataset[index]
            return self.transform(image.convert("RGB")), int(label), index
        except (OSError, ValueError, SyntaxError):  # truncated, unreadable or undecodable files
            return None, None, index


def collate_views(batch: list[tuple[Tensor | None, int | None, int]]) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """``(views [B, 3, S, S], labels [B], dataset indices [B], indices of the samples that did not decode)``."""
    good = [item for item in batch if item[0] is not None]
    failed = [index for view, _, index in batch if view is None]
    if not good:
        return torch.empty(0, 3, 0, 0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), failed
    views, labels, indices = zip(*good)
    return torch.stack(views), torch.tensor(labels), torch.tensor(indices), failed
