"""``lincls --variant full`` on one rank of a torchrun launch, or in one process: trains and scores
the tiny ViT on scenes (:func:`run`) and saves the head, the scores and which training images this
rank decoded as ``OUT/full<rank>.npz``, for ``test_lincls_full_ranks.py``."""

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from locatdino.evaluation import ranks
from locatdino.evaluation.class_splits import LabelledImages
from locatdino.evaluation.lincls import protocol
from tests.evaluation.hbird.hbird_fixtures import tiny_vit_model

TRAIN, VAL = 11, 7
BROKEN = 5  # a training image that does not decode: the ranks' shares of its batch are uneven
# global batches of 4, 4 and 3 images: shares of 2 + 2, 2 + 2 (one broken) and 2 + 1 per epoch
CFG = protocol.LinclsConfig(
    protocol="full", input_size=32, epochs=2, batch_size=4, lr=2.0, num_workers=0, eval_batch_size=4, progress=False
)


def scenes(count: int, seed: int, broken: int | None, loaded: list[int]) -> LabelledImages:
    """``count`` built-in scenes at 48 px labelled by their dominant class (of 10: top-5 is reported);
    ``loaded`` records each image asked for."""
    from locatdino.data import ScenesSegmentation
    from locatdino.data.scenes import SCENE_CLASSES, scene_class

    pairs = [ScenesSegmentation(count, size=48, seed=seed, split="train")[i] for i in range(count)]
    labels = np.array([scene_class(np.asarray(mask)) for _, mask in pairs], np.int64)

    def load(i: int):
        loaded.append(i)
        if i == broken:
            raise OSError(f"scene {i}: truncated")
        return pairs[i][0]

    return LabelledImages(labels, list(SCENE_CLASSES), load, lambda i: f"scene {i}")


@contextlib.contextmanager
def kept_heads() -> Iterator[list[nn.Linear]]:
    """The heads ``protocol.train_full`` returns while in the block (put back after)."""
    real, heads = protocol.train_full, []

    def keep(*args, **kwargs):
        head, skipped = real(*args, **kwargs)
        heads.append(head)
        return head, skipped

    protocol.train_full = keep
    try:
        yield heads
    finally:
        protocol.train_full = real


def run(out: Path) -> None:
    with ranks.evaluation_ranks() as launch, kept_heads() as heads:
        loaded: list[int] = []
        train, val = scenes(TRAIN, 0, BROKEN, loaded), scenes(VAL, 1, None, [])
        classes = len(train.class_names)
        result = protocol.linear_classification(
            tiny_vit_model(), train, val, classes, CFG, torch.device("cpu"), shared=True
        )
        np.savez(
            out / f"full{launch.rank}.npz",
            weight=heads[0].weight.detach().numpy(),
            bias=heads[0].bias.detach().numpy(),
            scores=np.array([result.top1, result.top5, result.num_train, result.num_val]),
            hits=result.hits,
            skipped=np.array(result.skipped["train"]),
            loaded=np.array(loaded, np.int64),
            world=launch.world_size,
        )


if __name__ == "__main__":
    run(Path(sys.argv[1]))
