"""Opening the labelled splits an evaluation needs (Hummingbird, the probes), by dataset name.

Readers come from ``locatdino.data.build_segmentation_dataset`` (VOC, ADE20K, shards, built-in
scenes). Here only what evaluation adds: a seeded random subset of a split (the reference
evaluates on fractions of the training set) and an in-RAM cache for the small sets the online
monitor re-reads at every evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class SubsetSplit:
    """Images ``indices`` of a segmentation dataset, keeping its protocol attributes."""

    def __init__(self, dataset: Any, indices: np.ndarray):
        self.dataset, self.indices = dataset, np.asarray(indices)
        self.num_classes, self.ignore_index = dataset.num_classes, dataset.ignore_index
        self.class_names = getattr(dataset, "class_names", None)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.dataset[int(self.indices[i])]


def split_share(dataset: Any, share: range) -> Any:
    """Images ``share`` of ``dataset`` (one rank's contiguous share, ``locatdino.evaluation.ranks``), with
    its protocol attributes; ``dataset`` itself when the share is all of it (one process)."""
    if len(share) == len(dataset):
        return dataset
    return SubsetSplit(dataset, np.arange(share.start, share.stop))


class CachedSplit(SubsetSplit):
    """All of a (small) dataset decoded once and kept in RAM."""

    def __init__(self, dataset: Any):
        super().__init__(dataset, np.arange(len(dataset)))
        self.items = [dataset[i] for i in range(len(dataset))]

    def __getitem__(self, i: int):
        return self.items[i]


def open_split(
    name: str,
    data_dir: str | None,
    split: str,
    count: int | None = None,
    seed: int = 0,
    scene_size: int = 224,
    default_scenes: int = 100,
    option: str | None = None,
) -> Any:
    """Split ``split`` of dataset ``name``, limited to a seeded random subset of ``count`` images.

    The built-in scenes are rendered on demand, so for them ``count`` is the number of scenes
    (``default_scenes`` when None) of ``scene_size`` px. A ``count`` above the split's size is
    refused naming ``option`` (the command-line flag that asked for it): scores of 3 images
    read as scores of the 16 asked for. Without ``option`` ``count`` is a cap (the whole split).
    """
    from locatdino.data import build_segmentation_dataset

    if count is not None and count < 1:  # 0 is not "the default": it would silently score the default count
        raise ValueError(f"the number of {split} images must be at least 1, got {count}")
    if name == "scenes":
        return build_segmentation_dataset(
            "scenes",
            data_dir,
            split,
            num_images=default_scenes if count is None else count,
            size=scene_size,
            seed=seed,
        )
    if data_dir is None:
        raise ValueError(f"dataset {name!r} needs a data directory (--data-dir)")
    dataset = build_segmentation_dataset(name, data_dir, split)
    if option is not None and count is not None and count > len(dataset):
        raise ValueError(
            f"{option} {count}: split {split!r} of {name} has only {len(dataset)} images (ask for at most "
            f"{len(dataset)}, or leave {option} out to use them all)"
        )
    if count is not None and count < len(dataset):
        rng = np.random.default_rng(seed)
        dataset = SubsetSplit(dataset, np.sort(rng.choice(len(dataset), size=count, replace=False)))
    return dataset
