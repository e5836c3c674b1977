"""``FilePairsSegmentation``: the map-style (image, mask) dataset over a list of file pairs that
the VOC, ADE20K, Pascal Context and COCO-Stuff readers share (a subclass finds the pairs and sets
the label metadata), and :func:`folder_pairs`, the pairing of the ``images/<split>`` +
``annotations/<split>`` layouts (ADE20K, COCO-Stuff)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from locatdino.data.decode import decode_mask, decode_rgb


class FilePairsSegmentation:
    """``ds[i] -> (PIL RGB image, mask [H, W])`` read from ``pairs[i] = (image path, mask path)``."""

    class_names: list[str]
    num_classes: int
    ignore_index: int | None

    def __init__(self, pairs: list[tuple[Path, Path]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Image.Image, np.ndarray]:
        image, mask = self.pairs[index]
        return decode_rgb(image, upright=False), decode_mask(mask)  # masks label the stored pixel grid


def folder_pairs(root: Path, split: str, mask_suffix: str, name: str) -> list[tuple[Path, Path]]:
    """``(root/images/split/X.jpg, root/annotations/split/X<mask_suffix>)`` for every image, sorted
    by file name; ``FileNotFoundError`` naming dataset ``name`` when there is no image or a mask
    is missing."""
    images = sorted((root / "images" / split).glob("*.jpg"))
    if not images:
        raise FileNotFoundError(f"{name} split {split!r}: no .jpg files in {root / 'images' / split}")
    pairs = [(p, root / "annotations" / split / f"{p.stem}{mask_suffix}") for p in images]
    missing = [str(m) for _, m in pairs if not m.is_file()]
    if missing:
        raise FileNotFoundError(f"{name} split {split!r}: {len(missing)} mask(s) missing, first: {missing[0]}")
    return pairs
