"""COCO-Stuff-164k semantic segmentation in MMSegmentation's standard layout.

    coco_stuff164k/
        images/{train2017,val2017}/<id>.jpg
        annotations/{train2017,val2017}/<id>_labelTrainIds.png   grayscale, values 0..170, 255

The ``_labelTrainIds`` masks are those MMSegmentation's converter
(``tools/dataset_converters/coco_stuff164k.py``) writes from the official stuffthingmaps: the 80
thing and 91 stuff classes as train ids 0..170 (``COCOStuffDataset``), unlabelled pixels 255.
Labels: 171 classes, **ignore index 255**. ``root`` may be ``coco_stuff164k`` or its parent.
"""

from __future__ import annotations

from pathlib import Path

from locatdino.data.datasets.file_pairs import FilePairsSegmentation, find_root, folder_pairs

COCO_STUFF_CLASSES: tuple[str, ...] = tuple(
    n.strip()
    for n in (
        "person, bicycle, car, motorcycle, airplane, bus, train, truck, boat, traffic light, fire hydrant, stop sign, "
        "parking meter, bench, bird, cat, dog, horse, sheep, cow, elephant, bear, zebra, giraffe, backpack, umbrella, "
        "handbag, tie, suitcase, frisbee, skis, snowboard, sports ball, kite, baseball bat, baseball glove, "
        "skateboard, surfboard, tennis racket, bottle, wine glass, cup, fork, knife, spoon, bowl, banana, apple, "
        "sandwich, orange, broccoli, carrot, hot dog, pizza, donut, cake, chair, couch, potted plant, bed, "
        "dining table, toilet, tv, laptop, mouse, remote, keyboard, cell phone, microwave, oven, toaster, sink, "
        "refrigerator, book, clock, vase, scissors, teddy bear, hair drier, toothbrush, banner, blanket, branch, "
        "bridge, building-other, bush, cabinet, cage, cardboard, carpet, ceiling-other, ceiling-tile, cloth, clothes, "
        "clouds, counter, cupboard, curtain, desk-stuff, dirt, door-stuff, fence, floor-marble, floor-other, "
        "floor-stone, floor-tile, floor-wood, flower, fog, food-other, fruit, furniture-other, grass, gravel, "
        "ground-other, hill, house, leaves, light, mat, metal, mirror-stuff, moss, mountain, mud, napkin, net, paper, "
        "pavement, pillow, plant-other, plastic, platform, playingfield, railing, railroad, river, road, rock, roof, "
        "rug, salad, sand, sea, shelf, sky-other, skyscraper, snow, solid-other, stairs, stone, straw, "
        "structural-other, table, tent, textile-other, towel, tree, vegetable, wall-brick, wall-concrete, wall-other, "
        "wall-panel, wall-stone, wall-tile, wall-wood, water-other, waterdrops, window-blind, window-other, wood"
    ).split(",")
)
COCO_STUFF_IGNORE_INDEX = 255
MASK_SUFFIX = "_labelTrainIds.png"
_SPLITS = {"train2017": "train2017", "train": "train2017", "val2017": "val2017", "val": "val2017"}


def find_coco_stuff_root(root: str | Path) -> Path:
    """The ``coco_stuff164k`` folder (holding ``images/`` and ``annotations/``)."""
    return find_root(root, ("coco_stuff164k",), ("images", "annotations"), "COCO-Stuff-164k")


def coco_stuff_pairs(root: str | Path, split: str = "val2017") -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of a split, sorted by file name; every image needs its mask."""
    if split not in _SPLITS:
        raise ValueError(f"COCO-Stuff split must be one of {sorted(_SPLITS)}, got {split!r}")
    return folder_pairs(find_coco_stuff_root(root), _SPLITS[split], MASK_SUFFIX, "COCO-Stuff")


class COCOStuffSegmentation(FilePairsSegmentation):
    """``ds[i] -> (PIL RGB image, mask uint8 [H, W])``; 171 classes, ignore index 255."""

    class_names: list[str] = list(COCO_STUFF_CLASSES)
    num_classes: int = len(COCO_STUFF_CLASSES)
    ignore_index: int | None = COCO_STUFF_IGNORE_INDEX

    def __init__(self, root: str | Path, split: str = "val2017") -> None:
        super().__init__(coco_stuff_pairs(root, split))
        self.root, self.split = Path(root), split
