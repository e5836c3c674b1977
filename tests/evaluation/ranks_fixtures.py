"""What the 2-rank worker (``ranks_worker.py``) and the test comparing it with one process both build."""

import numpy as np

from locatdino.probes.class_splits import LabelledImages
from tests.retrieval.hbird_fixtures import tiny_vit_model

TABLE_ROWS = 9  # 2 ranks: shares of 5 and 4
DROPPED_ROWS = (2, 3)  # both in rank 0's share: the ranks send 3 and 4 rows
SCENES = 7  # 2 ranks: shares of 4 and 3
BROKEN_SCENE = 4  # in rank 1's share: the ranks encode 4 and 2 images


def kept_rows(share: range) -> list[int]:
    return [i for i in share if i not in DROPPED_ROWS]


def labelled_scenes() -> LabelledImages:
    """``SCENES`` built-in scenes at 32 px labelled by their dominant class; scene ``BROKEN_SCENE``
    does not decode."""
    from locatdino.data import ScenesSegmentation
    from locatdino.data.scenes import SCENE_CLASSES, scene_class

    scenes = [ScenesSegmentation(SCENES, size=32, seed=0, split="train")[i] for i in range(SCENES)]

    def load(i: int):
        if i == BROKEN_SCENE:
            raise OSError(f"scene {i}: truncated")
        return scenes[i][0]

    labels = np.array([scene_class(np.asarray(mask)) for _, mask in scenes], np.int64)
    return LabelledImages(labels, list(SCENE_CLASSES), load, lambda i: f"scene {i}")


def tiny_encoder():
    return tiny_vit_model()
