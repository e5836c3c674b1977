"""LabelledShardDataModule: image-level scene labels from the shards, never a pixel label."""

import numpy as np
import pytest
import torch
from PIL import Image

from locatdino.common.errors import UserError
from locatdino.data import LabelledShardDataModule
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation, scene_class, scene_classes
from locatdino.data.shards.sources import FolderSource
from locatdino.data.shards.writer import write_shards
from locatdino.data.transforms.classification import ClassificationTransform

N = 12


def _module(tmp_path, labels: str) -> LabelledShardDataModule:
    dm = LabelledShardDataModule(
        str(tmp_path / "train"),
        val_urls=str(tmp_path / "val"),
        batch_size=N,
        num_workers=0,
        transform=ClassificationTransform(input_size=32, re_prob=0.0),
        labels=labels,
        shuffle_buffer=1,
        synthetic=N,
        synthetic_val=4,
        synthetic_size=32,
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("labels", ["cls", "classes.json"])
def test_scene_labels_are_those_of_the_masks(tmp_path, labels):
    """Every image's target is scene_class / scene_classes(0.05) of its own mask, and the batch
    holds nothing but the image and the target (no mask)."""
    dm = _module(tmp_path, labels)
    assert dm.num_classes == len(SCENE_CLASSES) and dm.multilabel == (labels == "classes.json")
    batch = next(iter(dm.build_stream()))
    assert set(batch) == {"image", "target", "skipped", "skipped_keys"} and batch["image"].shape == (N, 3, 32, 32)
    masks = [ScenesSegmentation(N, size=32)[i][1] for i in range(N)]
    if labels == "cls":
        expected = sorted(scene_class(m) for m in masks)
        assert batch["target"].dtype == torch.int64 and sorted(batch["target"].tolist()) == expected
    else:
        expected = sorted(tuple(scene_classes(m, 0.05)) for m in masks)
        got = sorted(tuple(torch.nonzero(t)[:, 0].tolist()) for t in batch["target"])
        assert batch["target"].shape == (N, len(SCENE_CLASSES)) and got == expected
    val = list(dm.val_dataloader())
    assert sum(len(b["target"]) for b in val) == 4


def test_shards_without_labels_are_one_clear_line(tmp_path):
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
    write_shards(FolderSource(tmp_path), tmp_path / "shards", workers=0, progress=False)
    dm = LabelledShardDataModule(str(tmp_path / "shards"), num_workers=0)
    with pytest.raises(UserError, match=r"train_urls: .*shard-000000.tar holds no 'cls' image-level label"):
        dm.setup("fit")


def test_posterize_keeps_at_least_one_bit_at_the_top_magnitude():
    """timm asks PosterizeIncreasing for 0 bits at magnitude 10 (reached with ``mstd`` noise), which
    Pillow refuses or blacks out; the patched argument keeps 1 bit and the op yields a two-level image."""
    from timm.data import auto_augment

    assert auto_augment.LEVEL_TO_ARG["PosterizeIncreasing"](10.0, {}) == (1,)
    assert auto_augment.LEVEL_TO_ARG["PosterizeIncreasing"](0.0, {}) == (4,)  # timm's own below the top
    op = auto_augment.AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)
    image = Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16).repeat(3).reshape(16, 16, 3))
    assert sorted(np.unique(np.asarray(op(image)))) == [0, 128]
