"""``FilePairsSegmentation``: the map-style (image, mask) dataset over a list of file pairs that
the VOC, ADE20K, Pascal Context and COCO-Stuff readers share (a subclass finds the pairs and sets
the label metadata), and the routines they share: :func:`find_root` (the dataset folder at or below
a given path), :func:`listed_pairs` (the VOC-style ``ImageSets`` list file) and :func:`folder_pairs`
(the ``images/<split>`` + ``annotations/<split>`` layouts of ADE20K and COCO-Stuff)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from locatdino.data.transforms.decode import decode_mask, decode_rgb


class FilePairsSegmentation:
    """``ds[i] -> (PIL RGB image, mask [H, W])`` read from ``pairs[i] = (image path, mask path)``."""

    class_names: list[str]
    num_classes: int
    ignore_index: int | None
    id_suffix: str = ""  # the part of an image file's stem that is not its id (Cityscapes: _leftImg8bit)

    def __init__(self, pairs: list[tuple[Path, Path]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Image.Image, np.ndarray]:
        image, mask = self.pairs[index]
        return decode_rgb(image, upright=False), decode_mask(mask)  # masks label the stored pixel grid

    def sample_ids(self) -> list[str]:
        """Every sample's image id, in order: its image file's name without ``id_suffix`` and
        extension (``2007_000032``, ``ADE_train_00000001``), the ids published subset lists name."""
        return [Path(image).stem.removesuffix(self.id_suffix) for image, _ in self.pairs]

    def sample_source(self, index: int) -> str:
        """Sample ``index`` named for messages: its mask file (and its image's name)."""
        image, mask = self.pairs[index]
        return f"{mask} (image {Path(image).name})"


def find_root(root: str | Path, nested: tuple[str, ...], subdirs: tuple[str, ...], name: str) -> Path:
    """The first of ``root`` and ``root/<n>`` for ``n`` in ``nested`` holding every folder of
    ``subdirs``; ``FileNotFoundError`` naming dataset ``name`` and the expected layout otherwise."""
    root = Path(root)
    for cand in (root, *(root / n for n in nested)):
        if all((cand / d).is_dir() for d in subdirs):
            return cand
    where = ", ".join(f"{n}/" for n in nested)
    raise FileNotFoundError(
        f"no {name} tree under {root} (expected {' and '.join(f'{d}/' for d in subdirs)} in it or in one of {where})"
    )


def check_pairs(pairs: list[tuple[Path, Path]], split: str, name: str) -> list[tuple[Path, Path]]:
    """``pairs`` unchanged when every file exists, else ``FileNotFoundError`` naming the first missing."""
    missing = [str(p) for pair in pairs for p in pair if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{name} split {split!r}: {len(missing)} file(s) missing, first: {missing[0]}")
    return pairs


def listed_pairs(list_file: Path, images: Path, masks: Path, split: str, name: str) -> list[tuple[Path, Path]]:
    """``(images/<id>.jpg, masks/<id>.png)`` for every id of a VOC-style ``list_file``, in its order;
    ``FileNotFoundError`` when the list or a listed file is missing."""
    if not list_file.is_file():
        raise FileNotFoundError(f"{name} split {split!r}: no list file {list_file}")
    ids = [line.split()[0] for line in list_file.read_text().splitlines() if line.strip()]
    return check_pairs([(images / f"{i}.jpg", masks / f"{i}.png") for i in ids], split, name)


def folder_pairs(root: Path, split: str, mask_suffix: str, name: str) -> list[tuple[Path, Path]]:
    """``(root/images/split/X.jpg, root/annotations/split/X<mask_suffix>)`` for every image, sorted
    by file name; ``FileNotFoundError`` naming dataset ``name`` when there is no image or a mask
    is missing."""
    images = sorted((root / "images" / split).glob("*.jpg"))
    if not images:
        raise FileNotFoundError(f"{name} split {split!r}: no .jpg files in {root / 'images' / split}")
    return check_pairs([(p, root / "annotations" / split / f"{p.stem}{mask_suffix}") for p in images], split, name)
