import numpy as np
import pytest

from locatdino.ssl.ibot import BlockMasking, mask_rng


def test_counts_and_shapes_as_configured():
    masking = BlockMasking(probability=0.5, ratio=(0.1, 0.5))
    masks = masking(num_crops=64, grid=(8, 8), rng=mask_rng(0, 0, 0, 0))
    assert masks.shape == (64, 64) and masks.dtype == bool
    counts = masks.sum(1)
    assert (counts > 0).sum() <= 32  # int(64 x 0.5) crops drawn for masking (a draw may place nothing)
    assert (counts > 0).sum() >= 28
    assert counts.max() <= int(64 * 0.5)


def test_each_masked_crop_gets_its_stratum_of_the_ratio_range():
    """The masked crops' targets are one draw per equal sub-interval of [low, high] (DINOv2's
    collate): sorted, the i-th masked crop's share lies at most in the i-th sub-interval."""
    masking = BlockMasking(probability=1.0, ratio=(0.1, 0.5))
    n, grid = 20, (16, 16)
    shares = np.sort(masking(n, grid, mask_rng(1, 0, 0, 0)).sum(1) / 256)
    edges = np.linspace(0.1, 0.5, n + 1)
    assert np.all(shares <= edges[1:] + 1e-9)
    # blocks reach the target almost always on a 16 x 16 grid: the mean share is near the middle
    assert 0.27 <= shares.mean() <= 0.31


def test_blocks_are_rectangles_with_bounded_aspect():
    masking = BlockMasking(min_patches=4, aspect=0.3)
    rng = mask_rng(2, 0, 0, 0)
    for _ in range(200):
        mask = np.zeros((14, 14), dtype=bool)
        added = masking._add_block(mask, 30, rng)
        if added:
            rows, cols = np.nonzero(mask)
            bh, bw = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
            assert added == mask.sum() == bh * bw <= 30
            assert 0.3 * 0.6 <= bh / bw <= 1 / (0.3 * 0.6)  # aspect in [0.3, 1/0.3], up to rounding


def test_masked_count_never_exceeds_the_target():
    masking = BlockMasking()
    rng = mask_rng(3, 0, 0, 0)
    for target in (1, 3, 5, 12, 40):
        assert masking.crop_mask((8, 8), target, rng).sum() <= target


def test_same_seed_rank_step_micro_batch_same_masks_else_different():
    masking = BlockMasking(probability=0.5)
    draw = lambda *key: masking(16, (8, 8), mask_rng(*key))  # noqa: E731
    assert np.array_equal(draw(0, 0, 5, 0), draw(0, 0, 5, 0))
    for other in [(1, 0, 5, 0), (0, 1, 5, 0), (0, 0, 6, 0), (0, 0, 5, 1)]:
        assert not np.array_equal(draw(0, 0, 5, 0), draw(*other)), other


def test_probability_zero_masks_nothing():
    assert not BlockMasking(probability=0.0)(8, (8, 8), mask_rng(0, 0, 0, 0)).any()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(ratio=(0.6, 0.2)), "mask_ratio"),
        (dict(probability=1.5), "mask_probability"),
        (dict(min_patches=0), "mask_min_patches"),
        (dict(aspect=2.0), "mask_aspect_ratio"),
    ],
)
def test_bad_settings_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockMasking(**kwargs)
