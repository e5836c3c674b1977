"""Data: WebDataset shards (``shards/``), dataset readers (``datasets/``), transforms (``transforms/``:
CPU and GPU multi-crop, photometric, decoding), built-in scenes (``scenes/``), the two data modules.

``ShardDataModule``, ``LabelledShardDataModule`` and ``SkippedSamplesLogger`` import Lightning, so
they load on first use: ``locatdino shards`` (which imports this package) does not pay for
Lightning's import.
"""

from __future__ import annotations

import importlib
from typing import Any

from locatdino.data.datasets.ade20k import ADE20K_CLASSES, ADE20KSegmentation
from locatdino.data.datasets.coco_stuff import COCO_STUFF_CLASSES, COCOStuffSegmentation
from locatdino.data.datasets.pascal_context import PASCAL_CONTEXT_CLASSES, PascalContextSegmentation
from locatdino.data.datasets.segmentation import build_segmentation_dataset
from locatdino.data.datasets.voc import VOC_CLASSES, VOCSegmentation
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation
from locatdino.data.shards.segmentation import ShardSegmentation
from locatdino.data.shards.sources import build_source
from locatdino.data.shards.stream import ShardLoader, ShardStream, expand_urls
from locatdino.data.shards.writer import write_shards
from locatdino.data.transforms.multicrop import MultiCropTransform, collate_multicrop

_LAZY = {
    "ShardDataModule": "locatdino.data.datamodule",
    "SkippedSamplesLogger": "locatdino.data.shards.skipped",
    "LabelledShardDataModule": "locatdino.data.labelled_datamodule",
}

__all__ = [
    "ADE20K_CLASSES",
    "COCO_STUFF_CLASSES",
    "PASCAL_CONTEXT_CLASSES",
    "SCENE_CLASSES",
    "VOC_CLASSES",
    "ADE20KSegmentation",
    "COCOStuffSegmentation",
    "LabelledShardDataModule",
    "MultiCropTransform",
    "PascalContextSegmentation",
    "ScenesSegmentation",
    "ShardDataModule",
    "ShardLoader",
    "ShardSegmentation",
    "ShardStream",
    "SkippedSamplesLogger",
    "VOCSegmentation",
    "build_segmentation_dataset",
    "build_source",
    "collate_multicrop",
    "expand_urls",
    "write_shards",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
