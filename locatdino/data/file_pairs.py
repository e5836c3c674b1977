"""``FilePairsSegmentation``: the map-style (image, mask) dataset over a list of file pairs that
the VOC and ADE20K readers share; a subclass finds the pairs and sets the label metadata."""

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
