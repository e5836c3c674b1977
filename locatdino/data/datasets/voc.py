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

from locatdino.data.datasets.file_pairs import FilePairsSegmentation, find_root, listed_pairs

VOC_CLASSES: tuple[str, ...] = (
    "background",
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)
VOC_IGNORE_INDEX = 255


def find_voc_root(root: str | Path) -> Path:
    """The ``VOC2012`` folder (holding ``JPEGImages``) at or below ``root``."""
    return find_root(root, ("VOC2012", "VOCdevkit/VOC2012"), ("JPEGImages",), "Pascal VOC 2012")


def voc_pairs(root: str | Path, split: str = "val") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of a VOC split, in list-file order; checks that every file exists."""
    voc = find_voc_root(root)
    lists = [
        voc / "ImageSets" / "Segmentation" / f"{split}.txt",
        voc / "ImageSets" / "SegmentationAug" / f"{split}.txt",
    ]
    masks = voc / ("SegmentationClassAug" if split == "trainaug" else "SegmentationClass")
    if not masks.is_dir() and (voc / "SegmentationClassAug").is_dir():
        masks = voc / "SegmentationClassAug"
    list_file = next((p for p in lists if p.is_file()), lists[0])
    return listed_pairs(list_file, voc / "JPEGImages", masks, split, "VOC")


class VOCSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; 21 classes, ignore index 255."""

    class_names: list[str] = list(VOC_CLASSES)
    num_classes: int = len(VOC_CLASSES)
    ignore_index: int | None = VOC_IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "val") -> None:
        super().__init__(voc_pairs(root, split))
        self.root, self.split = Path(root), split
