"""Pascal VOC 2012 semantic segmentation in its standard layout.

    VOCdevkit/VOC2012/
        JPEGImages/<id>.jpg
        SegmentationClass/<id>.png       palette PNG, indices 0..20, 255 = void (object borders)
        SegmentationClassAug/<id>.png    optional (SBD "aug" masks, grayscale PNG, same indices)
        ImageSets/Segmentation/{train,val,trainval,trainaug}.txt

Labels: 21 classes, 0 = background; **ignore index 255** (the void border). ``trainaug`` reads
``SegmentationClassAug`` (10,582 images); other splits read ``SegmentationClass`` and fall back to
``SegmentationClassAug`` when the former is missing. ``root`` may be the ``VOC2012`` folder, the
``VOCdevkit`` folder or the folder holding ``VOCdevkit``.
"""

from __future__ import annotations

from pathlib import Path

from locatdino.data.file_pairs import FilePairsSegmentation

VOC_CLASSES: tuple[str, ...] = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)
VOC_IGNORE_INDEX = 255


def find_voc_root(root: str | Path) -> Path:
    """The ``VOC2012`` folder (holding ``JPEGImages``) at or below ``root``."""
    root = Path(root)
    for cand in (root, root / "VOC2012", root / "VOCdevkit" / "VOC2012"):
        if (cand / "JPEGImages").is_dir():
            return cand
    raise FileNotFoundError(f"no Pascal VOC 2012 tree under {root} (expected JPEGImages/ in it, in VOC2012/ "
                            "or in VOCdevkit/VOC2012/)")


def voc_pairs(root: str | Path, split: str = "val") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of a VOC split, in list-file order; checks that every file exists."""
    voc = find_voc_root(root)
    lists = [voc / "ImageSets" / "Segmentation" / f"{split}.txt", voc / "ImageSets" / "SegmentationAug" / f"{split}.txt"]
    list_file = next((p for p in lists if p.is_file()), None)
    if list_file is None:
        raise FileNotFoundError(f"VOC split {split!r}: no list file {lists[0]}")
    masks = voc / ("SegmentationClassAug" if split == "trainaug" else "SegmentationClass")
    if not masks.is_dir() and (voc / "SegmentationClassAug").is_dir():
        masks = voc / "SegmentationClassAug"
    ids = [line.split()[0] for line in list_file.read_text().splitlines() if line.strip()]
    pairs = [(voc / "JPEGImages" / f"{i}.jpg", masks / f"{i}.png") for i in ids]
    missing = [str(p) for pair in pairs for p in pair if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"VOC split {split!r}: {len(missing)} listed file(s) missing, first: {missing[0]}")
    return pairs


class VOCSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; 21 classes, ignore index 255."""

    class_names: list[str] = list(VOC_CLASSES)
    num_classes: int = len(VOC_CLASSES)
    ignore_index: int | None = VOC_IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "val") -> None:
        super().__init__(voc_pairs(root, split))
        self.root, self.split = Path(root), split
