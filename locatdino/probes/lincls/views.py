"""The images of linear classification: DINO's training augmentation and its evaluation crop.

Training (the reference's ``eval_linear``): ``RandomResizedCrop(S)`` (scale (0.08, 1), bilinear)
and a horizontal flip with p = 0.5. Evaluation, and every image of the cached-feature variant:
``Resize(S · 256 / 224, bicubic)`` of the short side, then ``CenterCrop(S)`` — the reference's
Resize(256) + CenterCrop(224) at S = 224. Images come out uint8 ``[3, S, S]``; the ImageNet
normalisation is the encoder's (:class:`~locatdino.probes.lincls.features.LinearInput`).

Datasets give ``ds[i] -> (PIL image, class index)``. A sample that does not decode is skipped
with a warning naming it (:func:`~locatdino.evaluation.views.sample_name`) and counted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torchvision.transforms as T
from torch import Tensor
from torch.utils.data import Dataset

from locatdino.evaluation.views import sample_name

RESIZE_RATIO = 256 / 224  # the reference's evaluation resize over its crop


def train_transform(size: int) -> Callable[[Any], Tensor]:
    """DINO's linear-evaluation training augmentation, PIL image → uint8 ``[3, S, S]``."""
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])


def eval_transform(size: int) -> Callable[[Any], Tensor]:
    """Resize the short side to ``round(S · 256 / 224)`` (bicubic), centre crop ``S``: uint8 ``[3, S, S]``."""
    return T.Compose([T.Resize(round(size * RESIZE_RATIO), interpolation=T.InterpolationMode.BICUBIC),
                      T.CenterCrop(size), T.PILToTensor()])


class LabelledImages(Dataset):
    """``(image uint8 [3, S, S], class index, dataset index)`` of ``dataset[i]`` through ``transform``,
    or None (warned, naming the file) when the image does not decode."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Tensor]):
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, int, int] | None:
        try:
            image, label = self.dataset[index]
            return self.transform(image.convert("RGB")), int(label), index
        except (OSError, ValueError, SyntaxError) as err:
            warnings.warn(f"skipping {sample_name(self.dataset, index)}: {err}", stacklevel=2)
            return None


def collate_labelled(batch: list[tuple[Tensor, int, int] | None]) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(images [B, 3, S, S], labels [B], dataset indices [B], skipped)``: undecodable samples dropped, counted."""
    items = [b for b in batch if b is not None]
    if not items:
        return torch.empty(0, 3, 0, 0, dtype=torch.uint8), torch.empty(0, dtype=torch.long), \
            torch.empty(0, dtype=torch.long), len(batch)
    images, labels, indices = zip(*items)
    return torch.stack(images), torch.tensor(labels), torch.tensor(indices), len(batch) - len(items)
