"""Pascal Context 59 (PASCAL VOC 2010 with full-scene labels) in MMSegmentation's standard layout.

    VOCdevkit/VOC2010/
        JPEGImages/<id>.jpg
        SegmentationClassContext/<id>.png            grayscale, values 0..59
        ImageSets/SegmentationContext/{train,val}.txt

The masks are those MMSegmentation's converter (``tools/dataset_converters/pascal_context.py``)
writes from the Detail API: 0 is background (every class outside the 59 most frequent), 1..59 are
the 59 classes. The 59-class benchmark (MMSegmentation's ``PascalContextDataset59``, the paper's
"P-Context") ignores background: **ignore index 0**, ``num_classes`` 60 label values, IoU averaged
over classes 1..59 — the ADE20K convention of this package (MMSegmentation's
``reduce_zero_label`` shifts the same labels to 0..58 with ignore 255; the mIoU is identical).
Values above 59 are outside the classes and never scored. ``root`` may be the ``VOC2010`` folder,
the ``VOCdevkit`` folder or the folder holding ``VOCdevkit``.
"""

from __future__ import annotations

from pathlib import Path

from locatdino.data.datasets.file_pairs import FilePairsSegmentation, find_root, listed_pairs

PASCAL_CONTEXT_CLASSES: tuple[str, ...] = ("background",) + tuple(
    n.strip()
    for n in (
        "aeroplane, bag, bed, bedclothes, bench, bicycle, bird, boat, book, bottle, building, bus, cabinet, car, cat, "
        "ceiling, chair, cloth, computer, cow, cup, curtain, dog, door, fence, floor, flower, food, grass, ground, "
        "horse, keyboard, light, motorbike, mountain, mouse, person, plate, platform, pottedplant, road, rock, sheep, "
        "shelves, sidewalk, sign, sky, snow, sofa, table, track, train, tree, truck, tvmonitor, wall, water, window, "
        "wood"
    ).split(",")
)
PASCAL_CONTEXT_IGNORE_INDEX = 0


def find_pascal_context_root(root: str | Path) -> Path:
    """The ``VOC2010`` folder (holding ``JPEGImages`` and ``SegmentationClassContext``)."""
    return find_root(
        root, ("VOC2010", "VOCdevkit/VOC2010"), ("JPEGImages", "SegmentationClassContext"), "Pascal Context"
    )


def pascal_context_pairs(root: str | Path, split: str = "val") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of a split, in list-file order; checks that every file exists."""
    voc = find_pascal_context_root(root)
    return listed_pairs(
        voc / "ImageSets" / "SegmentationContext" / f"{split}.txt",
        voc / "JPEGImages",
        voc / "SegmentationClassContext",
        split,
        "Pascal Context",
    )


class PascalContextSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; values 0..59, ignore index 0 (background)."""

    class_names: list[str] = list(PASCAL_CONTEXT_CLASSES)
    num_classes: int = len(PASCAL_CONTEXT_CLASSES)
    ignore_index: int | None = PASCAL_CONTEXT_IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "val") -> None:
        super().__init__(pascal_context_pairs(root, split))
        self.root, self.split = Path(root), split
