import pytest
import torch

from locatdino.evaluation.hbird.patch_labels import patch_class_counts
from locatdino.evaluation.hbird.sampling import patches_per_image, rare_class_first


def test_patches_per_image_is_floor_of_budget():
    assert patches_per_image(1000, 30, 2) == 16  # floor(1000 / 60)
    with pytest.raises(ValueError, match="smaller than one patch per image view"):
        patches_per_image(10, 30, 2)


def _masks(b=4, grid=8, p=2):
    """Images mostly class 0, one patch of the rare class 2, a band of class 1."""
    masks = torch.zeros(b, grid * p, grid * p, dtype=torch.long)
    masks[:, : p * 3, :] = 1  # 3 rows of class-1 patches (24 patches)
    masks[:, -p:, -p:] = 2  # exactly one patch of class 2
    return masks


def test_keeps_exactly_n_per_image():
    counts, valid = patch_class_counts(_masks(), 2, 3)
    keep = valid > 0
    memory_size, num_images, epochs = 77, 4, 2
    n = patches_per_image(memory_size, num_images, epochs)  # floor(77 / 8) = 9
    sel = rare_class_first(counts, keep, n, torch.Generator().manual_seed(0))
    assert sel.sum(1).tolist() == [9, 9, 9, 9]


def test_prefers_rare_classes():
    counts, valid = patch_class_counts(_masks(b=64), 2, 3)
    keep = valid > 0
    sel = rare_class_first(counts, keep, 5, torch.Generator().manual_seed(0))
    rare = counts[..., 2] > 0  # 1 patch per image: score 1 x noise
    band = counts[..., 1] > 0  # 24 patches per image: score 24 x noise
    common = (counts[..., 0] > 0) & ~band  # 39 patches per image: score 39 x noise
    rates = [sel[m].float().mean().item() for m in (rare, band, common)]
    assert rates[0] == 1.0  # the rare-class patch is always kept
    assert rates[1] > 1.2 * rates[2]  # the rarer of the two large classes is kept more often
    assert sel.sum(1).eq(5).all()


def test_never_selects_unkept_patches():
    counts, valid = patch_class_counts(_masks(b=2), 2, 3)
    keep = torch.zeros_like(valid, dtype=torch.bool)
    keep[:, :3] = True
    sel = rare_class_first(counts, keep, 10, torch.Generator().manual_seed(0))
    assert sel.sum(1).tolist() == [3, 3]
    assert not (sel & ~keep).any()
