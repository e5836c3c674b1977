"""Paired bootstrap intervals (docs/evaluation.md) and the per-image confusion matrices they resample."""

import numpy as np
import pytest
import torch

from locatdino.evaluation.bootstrap import (
    accuracy_interval,
    miou_interval,
    miou_score,
    resample_weights,
    seed_mean_miou_interval,
)
from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.metric import ConfusionMatrix

C = 5


def _images(rng, n, accuracy, size=12):
    """Masks of ``n`` images and predictions right with probability ``accuracy`` (else a random class)."""
    target = rng.integers(0, C, (n, size, size))
    target[:, :2] = 255  # ignored pixels
    wrong = rng.random(target.shape) > accuracy
    pred = np.where(wrong, rng.integers(0, C, target.shape), np.clip(target, 0, C - 1))
    return pred, target


def _confusions(pred, target, ignore=255):
    cm = ConfusionMatrix(C, ignore, keep_images=True)
    for p, t in zip(pred, target):
        cm.update(p, t)
    return cm


def test_per_image_matrices_sum_to_the_streamed_matrix_and_batches_split_into_images():
    rng = np.random.default_rng(0)
    pred, target = _images(rng, 7, 0.6)
    one_by_one = _confusions(pred, target)
    batched = ConfusionMatrix(C, 255, keep_images=True)
    batched.update(pred[:3], target[:3])  # [B, H, W]: three images
    batched.update(pred[3:], target[3:])
    dense = one_by_one.images.dense()
    assert one_by_one.images.num_images == batched.images.num_images == 7
    assert np.array_equal(dense, batched.images.dense())
    assert np.array_equal(dense.sum(0), one_by_one.matrix.numpy())
    single = ConfusionMatrix(C, 255)
    single.update(pred[4], target[4])
    assert np.array_equal(dense[4], single.matrix.numpy())
    counts = one_by_one.images.class_counts()  # diagonal, row sums, column sums of each matrix
    assert np.array_equal(counts[:, 0], np.diagonal(dense, axis1=1, axis2=2))
    assert np.array_equal(counts[:, 1], dense.sum(2)) and np.array_equal(counts[:, 2], dense.sum(1))


@pytest.mark.parametrize("ignore", [255, 0])  # 0: an in-range ignore index (ADE20K) leaves the mean
def test_bootstrap_score_of_the_full_sample_is_the_reported_miou(ignore):
    rng = np.random.default_rng(1)
    pred_a, target = _images(rng, 9, 0.7)
    pred_b = np.where(rng.random(target.shape) < 0.2, 1, pred_a)
    a, b = _confusions(pred_a, target, ignore), _confusions(pred_b, target, ignore)
    score = miou_score(a.images.class_mask)
    assert score(a.images.class_counts().sum(0)[None])[0] == pytest.approx(100 * a.compute().miou, abs=1e-12)
    interval = miou_interval(a.images, b.images, resamples=50)
    assert interval.delta == pytest.approx(100 * (a.compute().miou - b.compute().miou), abs=1e-12)


def test_a_model_against_itself_is_exactly_zero():
    rng = np.random.default_rng(2)
    a = _confusions(*_images(rng, 25, 0.5)).images
    interval = miou_interval(a, a)
    assert (interval.delta, interval.low, interval.high) == (0.0, 0.0, 0.0) and interval.covers_zero
    hits = rng.random(25) < 0.5
    same = accuracy_interval(hits, hits)
    assert (same.delta, same.low, same.high) == (0.0, 0.0, 0.0)


def test_the_interval_shrinks_as_query_images_are_added():
    rng = np.random.default_rng(3)
    pred_a, target = _images(rng, 256, 0.6)
    pred_b = np.where(rng.random(target.shape) < 0.5, np.clip(target, 0, C - 1), rng.integers(0, C, target.shape))
    a, b = _confusions(pred_a, target).images.dense(), _confusions(pred_b, target).images.dense()
    widths = []
    for n in (16, 64, 256):  # the first n query images
        interval = miou_interval(ImageConfusions.from_matrices(a[:n]), ImageConfusions.from_matrices(b[:n]))
        widths.append(interval.high - interval.low)
    # the width falls as 1 / sqrt(n): about half per 4x more images
    assert widths[0] > 1.6 * widths[1] > 1.6**2 * widths[2] > 0


def test_vectorised_bootstrap_equals_a_loop_over_resamples():
    """The same seeded draws, scored one resample at a time by metric.py's ConfusionMatrix."""
    rng = np.random.default_rng(4)
    pred_a, target = _images(rng, 15, 0.6)
    pred_b, _ = _images(rng, 15, 0.5)
    a, b = _confusions(pred_a, target).images, _confusions(pred_b, target).images
    resamples, seed = 200, 11
    draws = np.random.default_rng(seed).integers(0, 15, (resamples, 15))
    dense_a, dense_b = a.dense(), b.dense()
    diffs = []
    for idx in draws:
        scores = []
        for dense in (dense_a, dense_b):
            cm = ConfusionMatrix(C, 255)
            cm.matrix = torch.from_numpy(dense[idx].sum(0))
            scores.append(100 * cm.compute().miou)
        diffs.append(scores[0] - scores[1])
    interval = miou_interval(a, b, resamples=resamples, seed=seed)
    low, high = np.percentile(diffs, [2.5, 97.5])
    assert interval.low == pytest.approx(low, abs=1e-10) and interval.high == pytest.approx(high, abs=1e-10)
    assert np.array_equal(
        resample_weights(15, resamples, seed), np.stack([np.bincount(d, minlength=15) for d in draws])
    )

    hits_a, hits_b = rng.random(15) < 0.6, rng.random(15) < 0.4
    naive = [100 * (hits_a[d].mean() - hits_b[d].mean()) for d in draws]
    accuracy = accuracy_interval(hits_a, hits_b, resamples=resamples, seed=seed)
    assert [accuracy.low, accuracy.high] == pytest.approx(list(np.percentile(naive, [2.5, 97.5])), abs=1e-10)


def test_seed_mean_interval_equals_a_loop_over_resamples_and_seeds():
    """Three seeds per model on the same 12 images: each resample's draw is shared by every seed
    and both models; the score is the mean over seeds of ConfusionMatrix's mIoU."""
    rng = np.random.default_rng(5)
    target = _images(rng, 12, 1.0)[1]
    runs = {m: [] for m in "ab"}
    for _s in range(3):
        for m, acc in (("a", 0.65), ("b", 0.55)):
            pred = np.where(rng.random(target.shape) > acc, rng.integers(0, C, target.shape), np.clip(target, 0, C - 1))
            runs[m].append(_confusions(pred, target).images)
    resamples, seed = 150, 3
    draws = np.random.default_rng(seed).integers(0, 12, (resamples, 12))

    def miou(dense, idx):
        cm = ConfusionMatrix(C, 255)
        cm.matrix = torch.from_numpy(dense[idx].sum(0))
        return 100 * cm.compute().miou

    dense = {m: [r.dense() for r in rs] for m, rs in runs.items()}
    diffs = [np.mean([miou(d, idx) for d in dense["a"]]) - np.mean([miou(d, idx) for d in dense["b"]]) for idx in draws]
    interval = seed_mean_miou_interval(runs["a"], runs["b"], resamples=resamples, seed=seed)
    assert [interval.low, interval.high] == pytest.approx(list(np.percentile(diffs, [2.5, 97.5])), abs=1e-10)
    full = np.arange(12)
    assert interval.delta == pytest.approx(
        np.mean([miou(d, full) for d in dense["a"]]) - np.mean([miou(d, full) for d in dense["b"]]), abs=1e-10
    )
    one = seed_mean_miou_interval(runs["a"][:1], runs["b"][:1], resamples=resamples, seed=seed)
    assert one == miou_interval(runs["a"][0], runs["b"][0], resamples=resamples, seed=seed)
    with pytest.raises(ValueError, match="same seeds"):
        seed_mean_miou_interval(runs["a"], runs["b"][:2])
    with pytest.raises(ValueError, match="same query images"):
        seed_mean_miou_interval(runs["a"][:1], [_confusions(*_images(rng, 5, 0.5)).images])


def test_confusions_round_trip_and_bad_files_are_named(tmp_path):
    matrices = np.zeros((3, C, C), np.int64)
    matrices[0, 1, 1], matrices[2, 4, 0] = 7, 3
    mask = np.array([False, True, True, True, True])
    saved = ImageConfusions.from_matrices(matrices, mask)
    assert len(saved.count) == 2  # sparse: the non-zero cells only
    loaded = ImageConfusions.load(saved.save(tmp_path / "c.npz"))
    assert loaded.num_images == 3 and np.array_equal(loaded.dense(), matrices)
    assert np.array_equal(loaded.class_mask, mask)
    (tmp_path / "bad.npz").write_bytes(b"no zip")
    with pytest.raises(ValueError, match="bad.npz: not a per-image confusion file"):
        ImageConfusions.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="same query images"):
        miou_interval(saved, ImageConfusions.from_matrices(matrices[:2], mask))


def _naive_matched_miou(cm: np.ndarray) -> float:
    """Hungarian-matched mIoU by brute force over every permutation (summed-IoU criterion)."""
    import itertools

    c = len(cm)
    best, best_iou = None, -1.0
    for perm in itertools.permutations(range(c)):
        m = cm[:, perm]
        iou = [
            m[k, k] / (m[k].sum() + m[:, k].sum() - m[k, k]) if m[k].sum() + m[:, k].sum() else np.nan for k in range(c)
        ]
        pair_iou = np.nansum(iou)
        if pair_iou > best_iou:
            best, best_iou = iou, pair_iou
    return 100 * float(np.nanmean(best))


def test_matched_miou_interval_equals_a_naive_resampling_with_brute_force_matching():
    from locatdino.evaluation.bootstrap import matched_miou_interval

    rng = np.random.default_rng(3)
    n, c, resamples = 12, 4, 60
    target = rng.integers(0, c, (n, 40))
    runs = {}
    for name, accuracy, relabel in (("a", 0.8, [2, 0, 3, 1]), ("b", 0.6, [0, 1, 2, 3])):
        pred = np.where(
            rng.random(target.shape) < accuracy, np.array(relabel)[target], rng.integers(0, c, target.shape)
        )
        runs[name] = np.stack([np.bincount(t * c + p, minlength=c * c).reshape(c, c) for t, p in zip(target, pred)])
    got = matched_miou_interval(
        ImageConfusions.from_matrices(runs["a"]),
        ImageConfusions.from_matrices(runs["b"]),
        resamples=resamples,
        seed=5,
        chunk=7,
    )
    draws = np.random.default_rng(5).integers(0, n, (resamples, n))  # the module's documented draws
    diffs = [_naive_matched_miou(runs["a"][d].sum(0)) - _naive_matched_miou(runs["b"][d].sum(0)) for d in draws]
    assert got.delta == pytest.approx(_naive_matched_miou(runs["a"].sum(0)) - _naive_matched_miou(runs["b"].sum(0)))
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))
    # a relabels every class, so its identity mIoU is far below b's while its matched mIoU is above
    assert (
        got.low
        > 0
        > miou_interval(ImageConfusions.from_matrices(runs["a"]), ImageConfusions.from_matrices(runs["b"])).high
    )
