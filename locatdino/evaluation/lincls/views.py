"""The images of linear classification: DINO's training augmentation and its evaluation crop.

Training (the reference's ``eval_linear``): torchvision's ``RandomResizedCrop(S)`` (scale
(0.08, 1), bilinear) and a horizontal flip with p = 0.5, then ImageNet mean / std. torchvision's,
not timm's: they draw from torch's RNG, so ``--seed`` fixes them (timm's crop draws from Python's
``random``). Evaluation, and every image of the cached-feature variant: the k-NN evaluation's
view (:func:`~locatdino.evaluation.class_features.eval_transform`: short side to ``S · 256 / 224``,
bicubic, centre crop ``S``, the reference's Resize(256) + CenterCrop(224)).

Each training view is drawn from its own seed, a function of ``(seed, epoch, image)``
(:func:`~locatdino.evaluation.views.view_generator`): the crops do not depend on the worker that
decodes the image, the rank that trains on it or where in the batch it falls, so a launch of many
ranks trains on the views one process does. :class:`RankBatches` gives each rank its share of
every global batch, in the order one process trains on them.

Datasets give ``ds[i] -> (PIL image, class index)`` (:mod:`locatdino.evaluation.class_splits`). A
sample that does not decode is skipped; :func:`collate_views` counts it and keeps its index, so
the run can name it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torchvision.transforms as T
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from locatdino.evaluation.ranks import Ranks
from locatdino.evaluation.views import view_generator


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


class SeededViews(ClassViews):
    """:class:`ClassViews` of keys ``(epoch, index)``: the view of ``dataset[index]`` in ``epoch``,
    its random draws (torchvision's, from the global RNG) seeded by ``(seed, epoch, index)`` alone
    on a forked RNG, which is left as it was."""

    def __init__(self, dataset: Any, transform: Callable[[Any], Tensor], seed: int):
        super().__init__(dataset, transform)
        self.seed = seed

    def __getitem__(self, key: tuple[int, int]) -> tuple[Tensor | None, int | None, int]:
        epoch, index = key
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(view_generator(self.seed, epoch, index).get_state())
            return super().__getitem__(index)


class RankBatches(Sampler[list[tuple[int, int]]]):
    """This rank's share of every training batch, keys of :class:`SeededViews`.

    An epoch's order is a permutation of the ``count`` images seeded by ``seed + epoch`` (that of
    DINO's ``DistributedSampler`` on one GPU; :meth:`set_epoch` before each epoch), cut into global
    batches of ``batch_size`` (the last one shorter); each rank takes its contiguous share of each
    (:meth:`~locatdino.evaluation.ranks.Ranks.share`). All ranks together see one process's batches,
    step by step, and every rank yields the same number of batches (a share may be empty), so their
    gradients can be averaged at every step."""

    def __init__(self, count: int, batch_size: int, seed: int, ranks: Ranks):
        self.count, self.batch_size, self.seed, self.ranks, self.epoch = count, batch_size, seed, ranks, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.count / self.batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        for start in range(0, self.count, self.batch_size):
            batch = order[start : start + self.batch_size]
            yield [(self.epoch, batch[i]) for i in self.ranks.share(len(batch))]


def collate_views(batch: list[tuple[Tensor | None, int | None, int]]) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """``(views [B, 3, S, S], labels [B], dataset indices [B], indices of the samples that did not decode)``."""
    good = [item for item in batch if item[0] is not None]
    failed = [index for view, _, index in batch if view is None]
    if not good:
        return torch.empty(0, 3, 0, 0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), failed
    views, labels, indices = zip(*good)
    return torch.stack(views), torch.tensor(labels), torch.tensor(indices), failed
