"""The position prior: Hummingbird's memory without features (docs/evaluation.md, "Baselines").

Scenes (and most photographs) have a layout: sky at the top, ground at the bottom. How much of a
segmentation score that alone explains is what a query patch scores when it predicts the classes
the memory holds *at its place in the image*, without looking at the image at all. The memory is
Hummingbird's (:func:`~locatdino.evaluation.hbird.evaluate.build_memory`: soft labels, budget and
valid-patch rule) built from the memory images as a query sees its image — whole, resized to the
input size (augmentation off: zoom-out views would move the layout in question) — and keyed by a
one-hot of each patch's grid position (:class:`~locatdino.models.baselines.PatchPosition`);
instead of its k nearest neighbours, a query patch at place (i, j) takes the mean soft label of
*every* memory patch at (i, j) as its class scores. Upsampling, argmax and the mIoU are
Hummingbird's, so the score sits in the same column. Every query image gets the same prediction
(up to its mask's size).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.hbird.evaluate import (
    HummingbirdConfig,
    HummingbirdResult,
    build_memory,
    check_splits,
    result_of,
    score_queries,
)
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.evaluation.phase_clock import PhaseClock
from locatdino.evaluation.provenance import run_provenance
from locatdino.models.baselines import PatchPosition


def position_frequencies(bank: MemoryBank, grid: int) -> Tensor:
    """``[C, grid, grid]`` float32: the mean soft label of the memory patches at each grid place
    (row-major one-hot features of :class:`PatchPosition`); zeros where the memory has none."""
    places = np.asarray(bank.features).argmax(1)
    sums = np.zeros((grid * grid, bank.num_classes))
    np.add.at(sums, places, np.asarray(bank.labels, dtype=np.float64))
    counts = np.bincount(places, minlength=grid * grid)
    means = sums / np.maximum(counts, 1)[:, None]
    return torch.from_numpy(means.T.reshape(bank.num_classes, grid, grid)).float()


def position_prior(
    patch_size: int,
    train_set: Any,
    val_set: Any,
    cfg: HummingbirdConfig,
    inspect: Callable[[Callable[[Tensor], Tensor]], None] | None = None,
) -> HummingbirdResult:
    """Score the position prior of ``train_set``'s memory on ``val_set`` on a grid of
    ``patch_size`` px patches (the model's: the same token grid), with ``cfg``'s budget and scoring
    (its memory augmentation does not apply: the whole images, once). ``inspect(scores_of)``, when
    given, gets the function from uint8 images to their class scores ``[B, C, h, w]``
    (``locatdino compare`` draws its predictions)."""
    check_splits(train_set, val_set)
    cfg = replace(cfg, augment="off", aug_epochs=1)
    extractor = FeatureExtractor(PatchPosition(patch_size, cfg.input_size // patch_size))
    grid = extractor.grid(cfg.input_size)
    clock, provenance, start = PhaseClock(), run_provenance(), time.perf_counter()
    bank, skipped_train = build_memory(extractor, train_set, cfg, clock)
    with clock("transfer"):
        prior = position_frequencies(bank, grid)

    def scores_of(images: Tensor) -> Tensor:
        return prior.expand(len(images), -1, -1, -1)

    cm, skipped_val = score_queries(scores_of, val_set, bank.num_classes, cfg, extractor, clock)
    search = {"precision": extractor.precision, "index": "none: the mean label at each grid place", "nprobe": None}
    result = result_of(
        cm, cfg, val_set, bank, len(train_set), skipped_train + skipped_val, clock, start, provenance, search
    )
    if inspect is not None:
        inspect(scores_of)
    return result
