"""Data: WebDataset shards, multi-crop transform, segmentation readers, built-in scenes.

``ShardDataModule``, ``LabelledShardDataModule`` and ``SkippedSamplesLogger`` import Lightning, so
they load on first use: ``locatdino shards`` (which imports this package) does not pay for
Lightning's import.
"""

from __future__ import annotations

import importlib
from typing import Any

from locatdino.data.ade20k import ADE20K_CLASSES, ADE20KSegmentation
from locatdino.data.coco_stuff import COCO_STUFF_CLASSES, COCOStuffSegmentation
from locatdino.data.multicrop import MultiCropTransform, collate_multicrop
from locatdino.data.pascal_context import PASCAL_CONTEXT_CLASSES, PascalContextSegmentation
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation
from locatdino.data.segmentation import build_segmentation_dataset
from locatdino.data.shard_segmentation import ShardSegmentation
from locatdino.data.shard_sources import build_source
from locatdino.data.shard_stream import ShardLoader, ShardStream, expand_urls
from locatdino.data.shard_writer import write_shards
from locatdino.data.voc import VOC_CLASSES, VOCSegmentation

_LAZY = {"ShardDataModule": "locatdino.data.datamodule", "SkippedSamplesLogger": "locatdino.data.skipped",
         "LabelledShardDataModule": "locatdino.data.labelled_datamodule"}

__all__ = [
    "ADE20K_CLASSES", "COCO_STUFF_CLASSES", "PASCAL_CONTEXT_CLASSES", "SCENE_CLASSES", "VOC_CLASSES",
    "ADE20KSegmentation", "COCOStuffSegmentation", "LabelledShardDataModule", "MultiCropTransform",
    "PascalContextSegmentation",
    "ScenesSegmentation", "ShardDataModule", "ShardLoader", "ShardSegmentation", "ShardStream",
    "SkippedSamplesLogger", "VOCSegmentation", "build_segmentation_dataset", "build_source",
    "collate_multicrop", "expand_urls", "write_shards",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
