"""The position prior against its definition: the memory's mean class fractions at each place."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.hbird.position_prior import position_prior
from tests.evaluation.hbird.hbird_fixtures import NoisyLayout

TOY = dict(input_size=32, augment="off", num_workers=0, progress=False, k=5, batch_size=4)


def naive_prior_miou(train, val, p):
    """Per place (i, j): the mean over memory images of each class's share of patch (i, j); every
    query predicts the bilinearly upsampled argmax of it; mIoU over classes with a union."""
    c, size = train.num_classes, train.masks[0].shape[0]
    prior = np.zeros((c, size // p, size // p))
    for mask in train.masks:
        for i in range(size // p):
            for j in range(size // p):
                prior[:, i, j] += (
                    np.bincount(mask[i * p : (i + 1) * p, j * p : (j + 1) * p].ravel(), minlength=c) / p**2
                )
    prior /= len(train.masks)
    up = F.interpolate(torch.tensor(prior[None]), size=(size, size), mode="bilinear", align_corners=False)
    pred = up.argmax(1)[0].numpy()
    confusion = sum(np.bincount(m.ravel().astype(int) * c + pred.ravel(), minlength=c * c) for m in val.masks)
    confusion = confusion.reshape(c, c)
    union = confusion.sum(0) + confusion.sum(1) - np.diag(confusion)
    return 100 * np.nanmean(np.where(union > 0, np.diag(confusion) / np.maximum(union, 1), np.nan)), confusion


def test_position_prior_is_the_memorys_class_frequency_at_each_place():
    train, val = NoisyLayout(6, 0), NoisyLayout(3, 1)
    expected, confusion = naive_prior_miou(train, val, 8)
    shown = []
    result = position_prior(8, train, val, HummingbirdConfig(**TOY), inspect=lambda scores_of: shown.append(scores_of))
    np.testing.assert_array_equal(result.image_confusions.dense().sum(0), confusion)
    assert result.miou == pytest.approx(expected, abs=1e-9) and 30 < expected < 90
    assert result.memory_patches == 6 * 16 and result.search["precision"] == "fp32"
    images = torch.zeros(2, 3, 32, 32, dtype=torch.uint8)
    assert shown[0](images).shape == (2, 3, 4, 4)  # the same scores for every image
    # the layout of the memory images themselves: zoom-out views (which move it) do not apply
    zoomed = position_prior(8, train, val, HummingbirdConfig(**{**TOY, "augment": "zoom-out", "aug_epochs": 2}))
    assert zoomed.miou == result.miou and zoomed.memory_patches == 6 * 16


def test_a_budget_keeps_the_memory_hummingbird_would():
    train, val = NoisyLayout(6, 0), NoisyLayout(3, 1)
    result = position_prior(8, train, val, HummingbirdConfig(**TOY, memory_size=48))
    assert result.memory_patches == 6 * 8  # floor(48 / 6) patches per image, rare classes first
    with pytest.raises(ValueError, match="not a multiple of the patch size 8"):
        position_prior(8, train, val, HummingbirdConfig(**{**TOY, "input_size": 36}))
