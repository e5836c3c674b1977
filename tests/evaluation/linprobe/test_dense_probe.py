"""The dense linear probe end to end: it learns what is linearly there, its cached and uncached
paths agree, and its per-image confusion matrices add up to the total."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from locatdino.evaluation.features import FeatureExtractor
from locatdino.evaluation.linprobe.protocol import LinearProbeConfig, evaluate_head, linear_probe, train_head
from locatdino.evaluation.linprobe.views import draw_order


class Stripes:
    """Images of 8 px columns, each column one of 3 classes (red 0 / green 1 / blue 2), mask the
    same: classes are constant over every 8 px patch, so a probe can be exactly right."""

    num_classes, ignore_index, class_names = 3, None, ["red", "green", "blue"]

    def __init__(self, count, seed, size=32):
        rng = np.random.default_rng(seed)
        self.masks = [np.repeat(np.tile(rng.integers(0, 3, size // 8), (size, 1)), 8, axis=1) for _ in range(count)]

    def __len__(self):
        return len(self.masks)

    def __getitem__(self, i):
        mask = self.masks[i]
        rgb = (np.eye(3)[mask] * 200).astype(np.uint8)
        return Image.fromarray(rgb), mask.astype(np.uint8)


class ColourTokens:
    """A frozen 'backbone' whose token of a patch is its mean colour plus a constant: the classes
    are linearly separable in the features (the extractor interface of the probe)."""

    patch_size, dim, device, precision = 8, 4, torch.device("cpu"), "fp32"

    def grid(self, size):
        return size // self.patch_size

    def __call__(self, images):
        mean = F.avg_pool2d(images.float() / 255, self.patch_size)  # [B, 3, h, w]
        return torch.cat([mean, torch.ones_like(mean[:, :1])], 1).permute(0, 2, 3, 1)


def test_probe_reaches_100_percent_on_linearly_separable_features():
    cfg = LinearProbeConfig(
        input_size=32, iterations=150, batch_size=8, augment="off", lr=1e-2, num_workers=0, progress=False
    )
    head, curve, skipped = train_head(ColourTokens(), Stripes(24, 0), cfg)
    assert skipped == 0 and len(curve) == 50 and curve[-1][1] < 0.2 * curve[0][1]
    val = Stripes(6, 1)
    cm, skipped = evaluate_head(ColourTokens(), head, val, cfg)
    per_image = cm.images.dense()
    assert cm.compute().miou > 0.99 and cm.compute().pixel_accuracy > 0.99
    assert per_image.shape == (6, 3, 3) and per_image.sum() == 6 * 32 * 32
    np.testing.assert_array_equal(per_image.sum(0), cm.matrix.numpy())


def test_budget_and_batch_order():
    assert LinearProbeConfig(epochs=2, batch_size=32).total_iterations(100) == 7  # ceil(200 / 32)
    assert LinearProbeConfig(iterations=40).total_iterations(100) == 40
    order = draw_order(10, 7, 4, seed=0)  # 28 slots: two whole shuffles, then 8 of a third
    assert order.shape == (7, 4)
    flat = order.ravel()
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert np.array_equal(order, draw_order(10, 7, 4, seed=0)) and not np.array_equal(order, draw_order(10, 7, 4, 1))
    with pytest.raises(ValueError, match="--iters"):
        LinearProbeConfig(iterations=3)
    with pytest.raises(ValueError, match="augment"):
        LinearProbeConfig(augment="strong")


def test_cached_and_uncached_paths_agree(scenes, tiny_vit, tmp_path):
    train, val = scenes
    results = {}
    for path, cache, ram_mb in (("cached", True, 4096), ("memory-mapped", True, 0), ("uncached", False, 4096)):
        cfg = LinearProbeConfig(
            input_size=64,
            iterations=12,
            batch_size=4,
            augment="off",
            cache=cache,
            cache_dir=str(tmp_path),
            max_cache_ram_mb=ram_mb,
            precision="fp32",
            num_workers=0,
            progress=False,
        )
        results[path] = linear_probe(tiny_vit, train, val, cfg)
    cached, uncached, mapped = results["cached"], results["uncached"], results["memory-mapped"]
    assert mapped.loss_curve == cached.loss_curve and mapped.miou == cached.miou
    assert list(tmp_path.iterdir()) == []  # the memory-mapped store is deleted after training
    assert cached.features["cached"] and not uncached.features["cached"]
    assert [i for i, _ in cached.loss_curve] == [i for i, _ in uncached.loss_curve] == list(range(1, 13))
    np.testing.assert_allclose([v for _, v in cached.loss_curve], [v for _, v in uncached.loss_curve], rtol=1e-4)
    assert cached.miou == pytest.approx(uncached.miou, abs=1e-6)
    np.testing.assert_array_equal(cached.image_confusions.dense().sum(0), uncached.image_confusions.dense().sum(0))
    assert cached.image_confusions.dense().shape == (6, 10, 10)
    assert cached.image_confusions.dense().sum() == 6 * 96 * 96  # scenes label every pixel
    assert "image_confusions" not in cached.to_dict() and cached.to_dict()["iterations"] == 12
    assert not any(p.requires_grad for p in tiny_vit.parameters()) and not tiny_vit.training


def test_official_augmentation_trains_on_augmented_crops(scenes, tiny_vit):
    train, _ = scenes
    extractor = FeatureExtractor(tiny_vit, precision="fp32", l2_normalize=False, to_cpu=False)
    cfg = LinearProbeConfig(
        input_size=32, iterations=5, batch_size=4, augment="reference", num_workers=0, progress=False
    )
    assert not cfg.cached
    head, curve, skipped = train_head(extractor, train, cfg)
    assert [i for i, _ in curve] == [1, 2, 3, 4, 5] and all(np.isfinite(v) for _, v in curve) and skipped == 0
    assert head.classifier.weight.shape == (10, 512, 1, 1) and not head.training
