"""ADE20K (SceneParsing, ``ADEChallengeData2016``) semantic segmentation in its standard layout.

    ADEChallengeData2016/
        images/{training,validation}/ADE_{train,val}_<n>.jpg
        annotations/{training,validation}/ADE_{train,val}_<n>.png   grayscale, values 0..150

Labels: values 1..150 are the 150 SceneParsing classes; 0 means "other / unlabelled" and is the
**ignore index (0)** of the benchmark (docs/evaluation.md: 151 label values, 0 ignored). ``num_classes`` is
therefore 151 and ``class_names[0] == "other"``; an evaluator excludes ``ignore_index`` pixels and
averages IoU over classes 1..150. (mmsegmentation's ``reduce_zero_label`` shifts the same labels to
0..149 with ignore 255; the mIoU is identical.) ``root`` may be ``ADEChallengeData2016`` or its parent.
"""

from __future__ import annotations

from pathlib import Path

from locatdino.data.datasets.file_pairs import FilePairsSegmentation, find_root, folder_pairs

ADE20K_CLASSES: tuple[str, ...] = ("other",) + tuple(
    n.strip()
    for n in (
        "wall, building, sky, floor, tree, ceiling, road, bed, windowpane, grass, cabinet, sidewalk, person, earth, "
        "door, table, mountain, plant, curtain, chair, car, water, painting, sofa, shelf, house, sea, mirror, rug, "
        "field, armchair, seat, fence, desk, rock, wardrobe, lamp, bathtub, railing, cushion, base, box, column, "
        "signboard, chest of drawers, counter, sand, sink, skyscraper, fireplace, refrigerator, grandstand, path, "
        "stairs, runway, case, pool table, pillow, screen door, stairway, river, bridge, bookcase, blind, "
        "coffee table, toilet, flower, book, hill, bench, countertop, stove, palm, kitchen island, computer, "
        "swivel chair, boat, bar, arcade machine, hovel, bus, towel, light, truck, tower, chandelier, awning, "
        "streetlight, booth, television receiver, airplane, dirt track, apparel, pole, land, bannister, escalator, "
        "ottoman, bottle, buffet, poster, stage, van, ship, fountain, conveyer belt, canopy, washer, plaything, "
        "swimming pool, stool, barrel, basket, waterfall, tent, bag, minibike, cradle, oven, ball, food, step, tank, "
        "trade name, microwave, pot, animal, bicycle, lake, dishwasher, screen, blanket, sculpture, hood, sconce, "
        "vase, traffic light, tray, ashcan, fan, pier, crt screen, plate, monitor, bulletin board, shower, "
        "radiator, glass, clock, flag"
    ).split(",")
)
ADE20K_IGNORE_INDEX = 0
_SPLITS = {"training": "training", "train": "training", "validation": "validation", "val": "validation"}


def find_ade20k_root(root: str | Path) -> Path:
    """The ``ADEChallengeData2016`` folder (holding ``images/`` and ``annotations/``)."""
    return find_root(root, ("ADEChallengeData2016",), ("images", "annotations"), "ADE20K")


def ade20k_pairs(root: str | Path, split: str = "validation") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of an ADE20K split, sorted by file name; every image needs its mask."""
    if split not in _SPLITS:
        raise ValueError(f"ADE20K split must be one of {sorted(_SPLITS)}, got {split!r}")
    return folder_pairs(find_ade20k_root(root), _SPLITS[split], ".png", "ADE20K")


class ADE20KSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; values 0..150, ignore index 0."""

    class_names: list[str] = list(ADE20K_CLASSES)
    num_classes: int = len(ADE20K_CLASSES)
    ignore_index: int | None = ADE20K_IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "validation") -> None:
        super().__init__(ade20k_pairs(root, split))
        self.root, self.split = Path(root), split
