"""Cityscapes (fine annotations) semantic segmentation in its published layout, 19 train-id classes.

    cityscapes/
        leftImg8bit/{train,val}/<city>/<city>_<seq>_<frame>_leftImg8bit.png
        gtFine/{train,val}/<city>/<city>_<seq>_<frame>_gtFine_labelTrainIds.png   (cityscapesScripts'
                                                                                  createTrainIdLabelImgs)
        gtFine/{train,val}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png        (as downloaded)

Labels: the 19 evaluated classes as train ids 0..18, **ignore index 255** (every other label id:
void, license plate, the classes Cityscapes does not evaluate). A ``labelTrainIds`` mask is read
as is; without one the ``labelIds`` mask is mapped to train ids with the benchmark's table
(:data:`LABEL_TO_TRAIN_ID`, cityscapesScripts' ``labels.py``), as open-hummingbird-eval does. An
image's id is its file name without ``_leftImg8bit.png`` (``aachen_000000_000019``), the form an
id list names. ``root`` may be the folder holding ``leftImg8bit/`` and ``gtFine/`` or its parent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from locatdino.data.datasets.file_pairs import FilePairsSegmentation, check_pairs, find_root

CITYSCAPES_CLASSES: tuple[str, ...] = (
    "road",
    "sidewalk",
    "building",
    "wall",
    "fence",
    "pole",
    "traffic light",
    "traffic sign",
    "vegetation",
    "terrain",
    "sky",
    "person",
    "rider",
    "car",
    "truck",
    "bus",
    "train",
    "motorcycle",
    "bicycle",
)
CITYSCAPES_IGNORE_INDEX = 255
# label id -> train id of the 19 evaluated classes (cityscapesScripts' labels.py); all else ignored
LABEL_TO_TRAIN_ID = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9,
    23: 10, 24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}  # fmt: skip
_TRAIN_ID_LUT = np.full(256, CITYSCAPES_IGNORE_INDEX, np.uint8)
_TRAIN_ID_LUT[list(LABEL_TO_TRAIN_ID)] = list(LABEL_TO_TRAIN_ID.values())
IMAGE_SUFFIX = "_leftImg8bit"
TRAIN_ID_MASK, LABEL_ID_MASK = "_gtFine_labelTrainIds.png", "_gtFine_labelIds.png"
SPLITS = ("train", "val")


def find_cityscapes_root(root: str | Path) -> Path:
    """The folder holding ``leftImg8bit/`` and ``gtFine/`` (fine annotations) at or below ``root``."""
    return find_root(root, ("cityscapes", "Cityscapes"), ("leftImg8bit", "gtFine"), "Cityscapes (fine annotations)")


def cityscapes_pairs(root: str | Path, split: str = "val") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of a split, sorted by image id; each image's ``labelTrainIds`` mask,
    or its ``labelIds`` mask where that is all there is. ``FileNotFoundError`` naming the file
    when there is no image or an image has neither mask."""
    if split not in SPLITS:
        raise ValueError(f"Cityscapes split must be one of {', '.join(SPLITS)} (fine annotations), got {split!r}")
    base = find_cityscapes_root(root)
    images = sorted((base / "leftImg8bit" / split).glob(f"*/*{IMAGE_SUFFIX}.png"), key=lambda p: p.name)
    if not images:
        where = base / "leftImg8bit" / split
        raise FileNotFoundError(f"Cityscapes split {split!r}: no <city>/*{IMAGE_SUFFIX}.png in {where}")
    pairs = []
    for image in images:
        stem = base / "gtFine" / split / image.parent.name / image.name.removesuffix(f"{IMAGE_SUFFIX}.png")
        train_ids = stem.with_name(stem.name + TRAIN_ID_MASK)
        pairs.append((image, train_ids if train_ids.is_file() else stem.with_name(stem.name + LABEL_ID_MASK)))
    return check_pairs(pairs, split, "Cityscapes")


def is_label_id_mask(mask_path: str | Path) -> bool:
    """Whether ``mask_path`` holds label ids (to be mapped), not train ids."""
    return str(mask_path).endswith(LABEL_ID_MASK)


def to_train_ids(mask: np.ndarray) -> np.ndarray:
    """A ``labelIds`` mask as train ids (uint8, 255 outside the 19 classes; a value outside
    0..255, from a 16-bit mask, is no label id either and lands on 0 or 255, both ignored)."""
    return _TRAIN_ID_LUT[np.clip(mask, 0, 255)]


class CityscapesSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; 19 train-id classes, ignore index 255."""

    class_names: list[str] = list(CITYSCAPES_CLASSES)
    num_classes: int = len(CITYSCAPES_CLASSES)
    ignore_index: int | None = CITYSCAPES_IGNORE_INDEX
    id_suffix = IMAGE_SUFFIX

    def __init__(self, root: str | Path, split: str = "val") -> None:
        super().__init__(cityscapes_pairs(root, split))
        self.root, self.split = Path(root), split

    def __getitem__(self, index: int) -> tuple[Image.Image, np.ndarray]:
        image, mask = super().__getitem__(index)
        return image, to_train_ids(mask) if is_label_id_mask(self.pairs[index][1]) else mask
