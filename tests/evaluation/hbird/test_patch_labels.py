import torch

from locatdino.evaluation.augment import PAD
from locatdino.evaluation.hbird.patch_labels import patch_class_counts, soft_labels


def naive_counts(masks, p, c):
    b, hh, ww = masks.shape
    h, w = hh // p, ww // p
    counts = torch.zeros(b, h * w, c, dtype=torch.int64)
    valid = torch.zeros(b, h * w, dtype=torch.int64)
    for i in range(b):
        for y in range(hh):
            for x in range(ww):
                v = int(masks[i, y, x])
                if v == PAD:
                    continue
                patch = (y // p) * w + x // p
                valid[i, patch] += 1
                counts[i, patch, v if 0 <= v < c else 0] += 1
    return counts, valid


def test_counts_match_naive_loop_with_void_and_padding():
    g = torch.Generator().manual_seed(0)
    masks = torch.randint(0, 5, (2, 12, 8), generator=g)
    masks[0, :3, :5] = 255  # void -> background
    masks[1, 6:, :] = PAD
    masks[1, 0, 0] = 7  # out of range (C = 5) -> background
    counts, valid = patch_class_counts(masks, 4, 5)
    ref_counts, ref_valid = naive_counts(masks, 4, 5)
    assert counts.shape == (2, 6, 5)
    assert torch.equal(counts, ref_counts)
    assert torch.equal(valid, ref_valid)
    assert valid[1].tolist() == [16, 16, 8, 8, 0, 0]  # rows 6-11 are padding


def test_soft_labels_are_fractions():
    masks = torch.tensor([[[0, 0, 1, 2], [0, 255, 1, PAD]]])  # one 2x4 image, patch 2
    counts, valid = patch_class_counts(masks, 2, 3)
    labels = soft_labels(counts, valid)
    assert torch.allclose(labels[0, 0], torch.tensor([1.0, 0.0, 0.0]))  # 255 counts as background
    assert torch.allclose(labels[0, 1], torch.tensor([0.0, 2 / 3, 1 / 3]))  # padding left out
    assert valid.tolist() == [[4, 3]]


def test_rejects_sizes_not_multiple_of_patch():
    import pytest

    with pytest.raises(ValueError, match="not a multiple of the patch size 4"):
        patch_class_counts(torch.zeros(1, 6, 8, dtype=torch.long), 4, 2)
