"""Paired bootstrap interval of a difference between two models scored on the same images (docs/evaluation.md).

Resample the query images with replacement — the *same* draws for both models —, recompute both
scores and their difference, and take the 2.5 / 97.5 percentiles of the differences over
``resamples`` draws (seeded: the same inputs always give the same interval).

Vectorised: a score here is a function of per-image counts summed over the images (mIoU of the
per-class true-positive / ground-truth / predicted pixel counts, top-1 of per-image hits), so a
resample's sums are one row of ``weights @ counts``, where ``weights [resamples, N]`` says how
often each image was drawn. All resamples of both models are one matrix product; ADE20K's
2,000 images × 150 classes × 1,000 resamples take well under a second.

The mIoU of a resample follows :func:`~locatdino.evaluation.metric.class_iou` (the reported
mIoU's rule: a class absent from the resample and never predicted leaves the mean). The
Hungarian-matched mIoU is not a function of summed per-class counts (the matching depends on the
whole matrix), so :func:`matched_miou_interval` sums each resample's full matrices (sparse, in
chunks of resamples) and redoes the matching per resample, with the same draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.metric import class_iou, hungarian_matched, matrix_miou, mean_iou

RESAMPLES = 1000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class PairedInterval:
    """``delta`` = score(a) − score(b) on all images, and its bootstrap interval ``[low, high]``
    at ``level`` (scores in percent)."""

    delta: float
    low: float
    high: float
    resamples: int = RESAMPLES
    seed: int = SEED
    level: float = LEVEL

    @property
    def covers_zero(self) -> bool:
        """No measurable difference: the interval holds 0 (docs/evaluation.md: "A beats B" only when it does not)."""
        return self.low <= 0 <= self.high

    def text(self, digits: int = 2) -> str:
        """``+0.26 [-0.41, +0.90]``."""
        return f"{self.delta:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PairedInterval:
        return cls(**data)


def resample_weights(num_images: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """``[resamples, num_images]``: how often each image is drawn in each resample (row ``b`` is
    ``bincount`` of ``default_rng(seed).integers(0, N, (resamples, N))[b]``)."""
    if num_images < 1 or resamples < 1:
        raise ValueError(f"bootstrap needs at least one image and one resample, got {num_images} and {resamples}")
    draws = np.random.default_rng(seed).integers(0, num_images, (resamples, num_images))
    offsets = (np.arange(resamples) * num_images)[:, None]
    return np.bincount((draws + offsets).ravel(), minlength=resamples * num_images).reshape(resamples, num_images)


def paired_bootstrap(
    counts_a: np.ndarray,
    counts_b: np.ndarray,
    score: Callable[[np.ndarray], np.ndarray],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> PairedInterval:
    """Interval of ``score(a) − score(b)``, where ``counts_* [N, ...]`` are per-image counts of the
    same ``N`` images and ``score`` maps summed counts ``[R, ...]`` to ``[R]`` scores."""
    counts_a, counts_b = np.asarray(counts_a, np.float64), np.asarray(counts_b, np.float64)
    if counts_a.shape != counts_b.shape:
        raise ValueError(
            f"paired bootstrap needs the same images for both models: counts {counts_a.shape} vs {counts_b.shape}"
        )
    n = len(counts_a)
    weights = resample_weights(n, resamples, seed).astype(np.float64)
    both = np.concatenate([counts_a.reshape(n, -1), counts_b.reshape(n, -1)], axis=1)
    sums = (weights @ both).reshape(resamples, 2, *counts_a.shape[1:])  # exact: integer counts < 2⁵³
    full = score(np.stack([counts_a.sum(0), counts_b.sum(0)]))
    return _interval(float(full[0] - full[1]), score(sums[:, 0]) - score(sums[:, 1]), resamples, seed, level)


def _interval(delta: float, diffs: np.ndarray, resamples: int, seed: int, level: float) -> PairedInterval:
    """``delta`` with the central ``level`` percentiles of the resampled differences ``diffs``."""
    diffs = diffs[np.isfinite(diffs)]  # a resample with no scorable class at all
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(diffs, [tail, 100 - tail]) if len(diffs) else (np.nan, np.nan)
    return PairedInterval(delta, float(low), float(high), resamples, seed, level)


def miou_score(class_mask: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """mIoU in percent of summed class counts ``[R, 3, C]`` (:meth:`ImageConfusions.class_counts`)."""
    return lambda counts: 100 * mean_iou(class_iou(counts[:, 0], counts[:, 1], counts[:, 2], class_mask))


def miou_interval(
    a: ImageConfusions, b: ImageConfusions, resamples: int = RESAMPLES, seed: int = SEED
) -> PairedInterval:
    """Δ mIoU (percent) of model ``a`` over model ``b`` on the same query images, with its interval."""
    if a.num_images != b.num_images or a.num_classes != b.num_classes:
        raise ValueError(
            f"paired bootstrap needs the same query images and classes: {a.num_images} images × "
            f"{a.num_classes} classes vs {b.num_images} × {b.num_classes}"
        )
    return paired_bootstrap(
        a.class_counts(), b.class_counts(), miou_score(a.class_mask & b.class_mask), resamples, seed
    )


def seed_mean_miou_interval(
    a: Sequence[ImageConfusions], b: Sequence[ImageConfusions], resamples: int = RESAMPLES, seed: int = SEED
) -> PairedInterval:
    """Δ of the mean over training seeds: ``mean_s mIoU(a[s]) − mean_s mIoU(b[s])``, where ``a[s]``
    and ``b[s]`` are the two models' runs of seed ``s`` scored on the same query images.

    Each resample draws the query images once and uses the draw for every seed and both models,
    so the interval is the image-sampling uncertainty of the seed-averaged difference; how much
    the difference moves between seeds is not in it (report the per-seed std beside it, docs/evaluation.md).
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"seed-mean interval needs the same seeds for both models, got {len(a)} and {len(b)} runs")
    runs = [*a, *b]
    if len({(r.num_images, r.num_classes) for r in runs}) != 1:
        raise ValueError(
            "seed-mean interval needs every run scored on the same query images and classes: "
            + ", ".join(f"{r.num_images}×{r.num_classes}" for r in runs)
        )
    mask = np.logical_and.reduce([r.class_mask for r in runs])
    per_seed = miou_score(mask)

    def seed_mean(counts: np.ndarray) -> np.ndarray:  # [R, S, 3, C] -> [R]
        return np.mean([per_seed(counts[:, s]) for s in range(counts.shape[1])], axis=0)

    stack = lambda runs: np.stack([r.class_counts() for r in runs], axis=1)  # noqa: E731  [N, S, 3, C]
    return paired_bootstrap(stack(a), stack(b), seed_mean, resamples, seed)


def accuracy_interval(
    correct_a: np.ndarray, correct_b: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED
) -> PairedInterval:
    """Δ top-1 (percent) of two classifiers from their per-image hits (booleans ``[N]``)."""

    def top1(hits: np.ndarray) -> np.ndarray:
        return 100 * hits[:, 0] / hits[:, 1]

    def counts(correct: np.ndarray) -> np.ndarray:
        correct = np.asarray(correct, np.float64)
        return np.stack([correct, np.ones_like(correct)], axis=1)

    return paired_bootstrap(counts(correct_a), counts(correct_b), top1, resamples, seed)


def _resampled_matrices(confusions: ImageConfusions, weights: np.ndarray) -> np.ndarray:
    """``[R, C, C]``: each resample's summed confusion matrix (``weights [R, N]`` draws per image)."""
    c = confusions.num_classes
    return np.asarray((confusions.sparse().T @ weights.T).T).reshape(len(weights), c, c)


def matched_miou_interval(
    a: ImageConfusions,
    b: ImageConfusions,
    criterion: str = "iou",
    resamples: int = RESAMPLES,
    seed: int = SEED,
    chunk: int = 100,
) -> PairedInterval:
    """Δ Hungarian-matched mIoU (percent) of model ``a`` over model ``b`` on the same query images,
    with its paired interval: every resample (the draws of :func:`miou_interval`) is matched anew."""
    if a.num_images != b.num_images or a.num_classes != b.num_classes:
        raise ValueError(
            f"paired bootstrap needs the same query images and classes: {a.num_images} images × "
            f"{a.num_classes} classes vs {b.num_images} × {b.num_classes}"
        )
    mask = a.class_mask & b.class_mask
    score = lambda cm: matrix_miou(hungarian_matched(cm, mask, criterion), mask)  # noqa: E731
    weights = resample_weights(a.num_images, resamples, seed).astype(np.float64)
    diffs = []
    for start in range(0, resamples, chunk):
        block = weights[start : start + chunk]
        for cm_a, cm_b in zip(_resampled_matrices(a, block), _resampled_matrices(b, block)):
            diffs.append(score(cm_a) - score(cm_b))
    ones = np.ones((1, a.num_images))
    full = score(_resampled_matrices(a, ones)[0]) - score(_resampled_matrices(b, ones)[0])
    return _interval(full, np.asarray(diffs), resamples, seed, LEVEL)
