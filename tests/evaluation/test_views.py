import numpy as np
import pytest
import torch
from PIL import Image

from locatdino.evaluation.augment import PairedAugmentation
from locatdino.evaluation.views import MemoryViews, QueryViews, collate_views, view_generator


class TinySet:
    """Protocol-following segmentation set; sample 1 is corrupt, sample 2 has a wrong-size mask."""

    num_classes, ignore_index, class_names = 3, 255, ["a", "b", "c"]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            raise OSError("broken JPEG")
        rng = np.random.default_rng(i)
        image = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
        mask = rng.integers(0, 3, (30, 41 if i == 2 else 40)).astype(np.uint8)
        return image, mask


def test_views_skip_and_count_corrupt_samples():
    views = MemoryViews(TinySet(), PairedAugmentation(32), epochs=2, seed=0)
    assert len(views) == 8
    with pytest.warns(UserWarning) as record:
        batch = [views[i] for i in range(4)]
    assert [str(w.message) for w in record] == [
        "skipping sample 1 of TinySet: broken JPEG",
        "skipping sample 2 of TinySet: mask (30, 41) does not match image (30, 40)",
    ]
    images, masks, skipped = collate_views(batch)
    assert images.shape == (2, 3, 32, 32) and skipped == 2 and masks[0].shape == (32, 32)


def test_query_views_keep_original_masks():
    image, mask = QueryViews(TinySet(), 32)[0]
    assert image.shape == (3, 32, 32) and mask.shape == (30, 40) and mask.dtype == torch.int32


def test_views_depend_only_on_seed_epoch_and_index():
    views = MemoryViews(TinySet(), PairedAugmentation(32), epochs=2, seed=5)
    a, b = views[4], views[4]  # epoch 1, image 0
    assert torch.equal(a[0], b[0])
    assert not torch.equal(views[0][1], a[1])  # epoch 0 of the same image differs
    g1, g2 = view_generator(0, 0, 1), view_generator(0, 1, 0)
    assert torch.rand(1, generator=g1).item() != torch.rand(1, generator=g2).item()
