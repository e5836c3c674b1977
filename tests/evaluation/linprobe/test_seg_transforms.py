"""The dense probe's augmentation and evaluation views (MMSegmentation's pipelines, docs/evaluation.md)."""

import colorsys

import numpy as np
import pytest
import torch

from locatdino.evaluation.linprobe.transforms import (
    IGNORE,
    ProbeAugmentation,
    eval_view,
    keep_ratio_size,
    photometric_distortion,
    scale_saturation,
    training_targets,
)


def test_keep_ratio_size_fits_the_long_and_the_short_side():
    assert keep_ratio_size(375, 500, 2048, 512) == (512, 683)  # a 4:3 VOC image: short side 512
    assert keep_ratio_size(500, 375, 2048, 512) == (683, 512)
    assert keep_ratio_size(100, 1000, 2048, 512) == (205, 2048)  # 10:1: the long side binds
    assert keep_ratio_size(64, 64, 4 * 32 * 0.5, 32 * 0.5) == (16, 16)


def test_training_targets_ignore_rules():
    mask = torch.tensor([[0, 1, 59, 60], [255, 3, 0, 7]])
    pc = training_targets(mask, 60, 0)  # Pascal Context 59: background 0 ignored, > 59 not a class
    assert pc.tolist() == [[IGNORE, 1, 59, IGNORE], [IGNORE, 3, IGNORE, 7]]
    coco = training_targets(mask, 171, 255)  # COCO-Stuff: 0 is a class (person), 255 ignored
    assert coco.tolist() == [[0, 1, 59, 60], [IGNORE, 3, 0, 7]]


def test_scale_saturation_is_hsv_saturation_scaling():
    rng = np.random.default_rng(0)
    rgb = rng.uniform(0, 1, (3, 4, 5)).astype(np.float32)
    rgb[:, 0, 0] = 0.4  # grey: unchanged
    for factor in (0.5, 1.4, 3.0):
        out = scale_saturation(torch.from_numpy(rgb), factor).numpy()
        for y in range(4):
            for x in range(5):
                h, s, v = colorsys.rgb_to_hsv(*rgb[:, y, x])
                np.testing.assert_allclose(out[:, y, x], colorsys.hsv_to_rgb(h, min(1.0, s * factor), v), atol=1e-5)


def _striped(height=64, width=256):
    """A mask whose left 3/4 is class 1 and right 1/4 class 2 (and a matching image)."""
    mask = torch.ones(height, width, dtype=torch.int32)
    mask[:, 3 * width // 4 :] = 2
    image = (mask * 100).to(torch.uint8).expand(3, -1, -1).contiguous()
    return image, mask


def test_crops_redraw_when_one_class_dominates():
    image, mask = _striped()
    rule = ProbeAugmentation(32, ratio=(1, 1), flip_p=0, photometric=False)
    free = ProbeAugmentation(32, ratio=(1, 1), flip_p=0, photometric=False, cat_max_ratio=1.0)

    def mixed(aug, seed):
        _, t = aug(image, mask, torch.Generator().manual_seed(seed))
        counts = torch.bincount(t.flatten().long())
        return len(counts[counts > 0]) > 1 and counts.max() < 0.75 * counts.sum()

    # resized to 32 x 128 px: only offsets 73..87 of 0..96 pass the rule (p 0.15); 10 redraws make
    # a passing crop 84 % likely, against 15 % without them
    assert sum(mixed(rule, s) for s in range(40)) >= 28
    assert sum(mixed(free, s) for s in range(40)) <= 12


def test_augmentation_shapes_padding_and_determinism():
    image, mask = _striped(40, 50)
    aug = ProbeAugmentation(64)
    a = aug(image, mask, torch.Generator().manual_seed(3))
    b = aug(image, mask, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    shapes, padded = set(), 0
    for seed in range(20):
        img, target = aug(image, mask, torch.Generator().manual_seed(seed))
        shapes.add((tuple(img.shape), tuple(target.shape), img.dtype))
        assert set(target.unique().tolist()) <= {IGNORE, 1, 2}
        padded += bool((target == IGNORE).any())
    assert shapes == {((3, 64, 64), (64, 64), torch.uint8)}
    assert padded > 0  # ratio < 1 makes the 40 x 50 image smaller than the crop: padded with IGNORE


def test_photometric_distortion_changes_colours_within_range():
    image = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8)
    outs = [photometric_distortion(image, torch.Generator().manual_seed(s)) for s in range(10)]
    assert all(o.dtype == torch.uint8 and o.shape == image.shape for o in outs)
    assert sum(not torch.equal(o, image) for o in outs) >= 8


@pytest.mark.parametrize(
    "shape,size,padded,scaled",
    [((60, 90), 32, (32, 48), (32, 48)), ((50, 70), 32, (32, 48), (32, 45)), ((128, 128), 128, (128, 128), (128, 128))],
)
def test_test_view_short_side_and_patch_padding(shape, size, padded, scaled):
    image = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)
    view, hw = eval_view(image, size, 8)
    assert tuple(view.shape[-2:]) == padded and hw == scaled
    if shape == (128, 128):
        assert torch.equal(view, image)  # already at the evaluation size: untouched
