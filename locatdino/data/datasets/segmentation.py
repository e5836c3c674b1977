"""``build_segmentation_dataset``: one entry point to every labelled (image, mask) reader.

All readers follow one protocol (INTERFACES.md): ``ds[i] -> (PIL RGB image, mask [H, W])``,
attributes ``num_classes`` (label values ``0 .. num_classes - 1``), ``ignore_index`` and
``class_names``.

| name    | reader                | classes                     | ignore index          |
| ------- | --------------------- | --------------------------- | --------------------- |
| scenes  | ``ScenesSegmentation`` | 10 (every pixel labelled)   | None                  |
| voc     | ``VOCSegmentation``    | 21 (0 = background)         | 255 (object borders)  |
| ade20k  | ``ADE20KSegmentation`` | 151 values (0 = "other")    | 0                     |
| pascal_context | ``PascalContextSegmentation`` | 60 values (0 = background) | 0       |
| coco_stuff | ``COCOStuffSegmentation`` | 171                      | 255 (unlabelled)      |
| cityscapes | ``CityscapesSegmentation`` | 19 (train ids)           | 255 (other label ids) |
| shards  | ``ShardSegmentation``  | from ``index.json``         | from ``index.json``   |
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from locatdino.data.datasets.ade20k import ADE20KSegmentation
from locatdino.data.datasets.cityscapes import CityscapesSegmentation
from locatdino.data.datasets.coco_stuff import COCOStuffSegmentation
from locatdino.data.datasets.pascal_context import PascalContextSegmentation
from locatdino.data.datasets.voc import VOCSegmentation
from locatdino.data.scenes import ScenesSegmentation
from locatdino.data.shards.segmentation import ShardSegmentation

DATASETS = ("scenes", "voc", "ade20k", "pascal_context", "coco_stuff", "cityscapes", "shards")


def build_segmentation_dataset(name: str, data_dir: str | Path | None, split: str, **kwargs: Any) -> Any:
    """The ``split`` of dataset ``name`` read from ``data_dir``.

    - ``scenes``: ``data_dir`` is ignored; ``split`` is train/val; ``kwargs`` go to
      ``ScenesSegmentation`` (``num_images`` default 100, ``size``, ``seed``).
    - ``voc``: ``data_dir`` is the VOC tree; split train/val/trainval/trainaug.
    - ``ade20k``: ``data_dir`` is the ADE20K tree; split training/validation (or train/val).
    - ``pascal_context``: ``data_dir`` is the VOC2010 tree with Pascal Context 59 masks; split train/val.
    - ``coco_stuff``: ``data_dir`` is the COCO-Stuff-164k tree; split train2017/val2017 (or train/val).
    - ``cityscapes``: ``data_dir`` holds ``leftImg8bit/`` and ``gtFine/``; split train/val.
    - ``shards``: ``data_dir/split`` if that folder exists, else ``data_dir`` itself (a folder,
      glob or brace pattern of shards written with segmentation masks); ``kwargs`` go to
      ``ShardSegmentation``.
    """
    name = name.lower()
    if name == "scenes":
        return ScenesSegmentation(split=split, **{"num_images": 100, **kwargs})
    if name not in DATASETS:
        raise ValueError(f"unknown segmentation dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if data_dir is None:
        raise ValueError(f"dataset {name!r} needs a data directory")
    if name == "voc":
        return VOCSegmentation(data_dir, split, **kwargs)
    if name == "ade20k":
        return ADE20KSegmentation(data_dir, split, **kwargs)
    if name == "pascal_context":
        return PascalContextSegmentation(data_dir, split, **kwargs)
    if name == "coco_stuff":
        return COCOStuffSegmentation(data_dir, split, **kwargs)
    if name == "cityscapes":
        return CityscapesSegmentation(data_dir, split, **kwargs)
    folder = Path(data_dir) / split
    return ShardSegmentation(str(folder) if folder.is_dir() else str(data_dir), **kwargs)
