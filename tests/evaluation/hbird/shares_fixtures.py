"""What the 2-rank Hummingbird worker (``shares_worker.py``) and the tests comparing it with one process both build."""

import numpy as np

from locatdino.data import ScenesSegmentation
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.metric import ConfusionMatrix
from locatdino.evaluation.splits import CachedSplit

MEMORY_SCENES = 9  # x 2 epochs: 18 views, shares of 9 and 9 on 2 ranks
BROKEN_SCENE = 2  # views 2 (rank 0's share) and 11 (rank 1's) do not decode
CONFUSION_IMAGES = 7  # 2 ranks: shares of 4 and 3
CLASSES = 4


class BrokenAt:
    """``dataset`` whose image ``broken`` does not decode (``OSError``, as a truncated file)."""

    def __init__(self, dataset, broken: int):
        self.dataset, self.broken = dataset, broken
        self.num_classes, self.ignore_index = dataset.num_classes, dataset.ignore_index
        self.class_names = dataset.class_names

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        if i == self.broken:
            raise OSError(f"scene {i}: truncated")
        return self.dataset[i]


def memory_scenes() -> BrokenAt:
    return BrokenAt(CachedSplit(ScenesSegmentation(MEMORY_SCENES, size=48, seed=0, split="train")), BROKEN_SCENE)


def budget_config(**changes) -> HummingbirdConfig:
    """Two augmented epochs and a budget of 20 patches per view (of 36): the sampling noise decides."""
    base = dict(input_size=48, aug_epochs=2, memory_size=MEMORY_SCENES * 2 * 20, batch_size=4, num_workers=0)
    return HummingbirdConfig(**base, progress=False, **changes)


def confusion_pair(i: int) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, target) of query image ``i``: sizes and labels differ from image to image."""
    rng = np.random.default_rng(i)
    shape = (5 + i, 9 - i % 3)
    target = rng.integers(0, CLASSES, shape)
    target[0, 0] = 255  # ignored
    return rng.integers(0, CLASSES, shape), target


def confusions_of(images: range) -> ConfusionMatrix:
    cm = ConfusionMatrix(CLASSES, 255, keep_images=True)
    for i in images:
        cm.update(*confusion_pair(i))
    return cm
