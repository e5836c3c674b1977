import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import confusion_matrix

from locatdino.evaluation.metric import ConfusionMatrix


def _reference_miou(pred, target, num_classes, ignore):
    keep = target != ignore
    cm = confusion_matrix(target[keep], pred[keep], labels=np.arange(num_classes)).astype(float)
    tp = np.diag(cm)
    union = cm.sum(0) + cm.sum(1) - tp
    iou = np.where(union > 0, tp / np.maximum(union, 1), np.nan)
    return cm, iou


@pytest.mark.parametrize("ignore", [255, 0])
def test_matches_sklearn_over_streamed_batches(ignore):
    rng = np.random.default_rng(0)
    c = 6
    target = rng.integers(0, c, size=(5, 20, 30))
    target[:, :4] = 255
    pred = np.where(rng.random(target.shape) < 0.6, np.clip(target, 0, c - 1), rng.integers(0, c, target.shape))
    pred[target == 255] = rng.integers(0, c, (target == 255).sum())
    cm = ConfusionMatrix(c, ignore_index=ignore)
    for p, t in zip(pred, target):  # streamed one image at a time
        cm.update(torch.from_numpy(p), torch.from_numpy(t))
    valid = (target != ignore) & (target < c)
    ref_cm, ref_iou = _reference_miou(pred[valid], target[valid], c, ignore)
    assert np.array_equal(cm.matrix.numpy(), ref_cm)
    result = cm.compute()
    if 0 <= ignore < c:
        ref_iou[ignore] = np.nan  # an in-range ignore index (ADE20K's 0) is not a class of the mean
    np.testing.assert_allclose(result.iou, ref_iou, equal_nan=True)
    assert result.miou == pytest.approx(np.nanmean(ref_iou))
    assert result.pixel_accuracy == pytest.approx(np.trace(ref_cm) / ref_cm.sum())


def test_hungarian_recovers_permuted_predictions():
    rng = np.random.default_rng(1)
    target = torch.from_numpy(rng.integers(0, 4, size=(50, 50)))
    perm = torch.tensor([2, 0, 3, 1])
    cm = ConfusionMatrix(4, ignore_index=None)
    cm.update(perm[target], target)
    assert cm.compute("identity").miou == 0.0
    assert cm.compute("hungarian").miou == pytest.approx(1.0)


def test_absent_classes_are_left_out_of_the_mean():
    cm = ConfusionMatrix(4, ignore_index=None)
    cm.update(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 0]))
    result = cm.compute()
    assert np.isnan(result.iou[2]) and np.isnan(result.iou[3])
    assert result.miou == pytest.approx((2 / 3 + 1 / 2) / 2)


def test_bad_predictions_raise():
    cm = ConfusionMatrix(3)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        cm.update(torch.tensor([5]), torch.tensor([1]))


def _matrix(rows):
    cm = ConfusionMatrix(len(rows), ignore_index=None)
    cm.matrix = torch.tensor(rows, dtype=torch.int64)
    return cm


def _miou(rows, perm):
    """Naive mIoU after ground truth g is matched to prediction perm[g]."""
    rows = np.asarray(rows, dtype=float)
    return np.mean([rows[g, p] / (rows[g].sum() + rows[:, p].sum() - rows[g, p]) for g, p in enumerate(perm)])


@pytest.mark.parametrize("seed", range(6))
def test_hungarian_criteria_equal_brute_force_over_permutations(seed):
    rng = np.random.default_rng(seed)
    c = 3 + seed % 3
    rows = rng.integers(0, 30, (c, c)) * rng.integers(1, 8, (c, 1))  # uneven class sizes
    rows[:, 0] += 1  # every class present in the ground truth: no empty union
    perms = list(itertools.permutations(range(c)))
    cm = _matrix(rows.tolist())
    best_iou = max(_miou(rows, p) for p in perms)
    assert cm.compute("hungarian", "iou").miou == pytest.approx(best_iou)
    best_pixels = max(sum(rows[g, p] for g, p in enumerate(perm)) for perm in perms)
    assert np.trace(cm.hungarian_matched("pixels")) == best_pixels


def test_iou_and_pixel_criteria_differ_on_a_constructed_case():
    # ground truth rows: background (80 px) mostly predicted as 2; class 1 (18 px) split over
    # predictions 0/1; class 2 (7 px) predicted as 2. Pixels: 0->2, 1->0, 2->1 (60+9+0 = 69 px);
    # IoU: 0->2, 1->1, 2->0 (67 px, but class 1 gets IoU 7/18 instead of 9/38).
    rows = [[20, 0, 60], [9, 7, 2], [0, 0, 7]]
    cm = _matrix(rows)
    iou, pixels = cm.compute("hungarian", "iou").miou, cm.compute("hungarian", "pixels").miou
    assert iou == pytest.approx(_miou(rows, (2, 1, 0))) and pixels == pytest.approx(_miou(rows, (2, 0, 1)))
    assert iou == pytest.approx(0.35435, abs=1e-5) and pixels == pytest.approx(0.30367, abs=1e-5)
    with pytest.raises(ValueError, match="criterion must be one of"):
        cm.compute("hungarian", "counts")
