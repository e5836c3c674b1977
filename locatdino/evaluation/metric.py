"""Streaming confusion-matrix mIoU (docs/evaluation.md).

One ``C×C`` int64 matrix accumulated with ``np.bincount`` per batch, so memory is bounded by
the batch, not the dataset (the reference keeps every predicted pixel in a Python list: tens of
GB at 512 px). Rows are ground truth, columns predictions.

- Identity mapping (default): prediction ``c`` means class ``c`` — the honest score for label
  transfer, where predictions are class ids by construction.
- Hungarian matching (comparison with published tables): predicted ids are first permuted by
  a one-to-one assignment (``scipy.optimize.linear_sum_assignment``). Criterion ``"iou"``
  (default) maximises the summed IoU of the matched (ground truth, prediction) pairs, as the
  Hummingbird reference does (it minimises ``1 - IoU``); ``"pixels"`` maximises the matched
  pixel counts (the diagonal of the permuted matrix), the rule of many unsupervised
  segmentation papers. They differ when a large class can trade a few pixels of overlap for a
  much better IoU of a small one.

IoU of class c = TP / (TP + FP + FN). A class with an empty union (never present, never
predicted) has IoU NaN and is left out of the mean; the ignore index, when it is one of the
label values (ADE20K's 0), is never a class of the mean. :func:`class_iou` is that rule on any
stack of per-class counts, so the paired bootstrap (``bootstrap.py``) scores its resamples by
exactly the rule of the reported mIoU.

With ``keep_images`` the matrix also keeps one sparse confusion matrix per image
(:class:`~locatdino.evaluation.image_confusions.ImageConfusions`), what the bootstrap resamples.
Ranks that each scored a contiguous share of the images join their matrices with
:func:`gather_confusions` (``locatdino.evaluation.ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from locatdino.evaluation.image_confusions import ImageConfusions
from locatdino.evaluation.ranks import current_ranks, gather_objects, gather_rows

HUNGARIAN_CRITERIA = ("iou", "pixels")


@dataclass(frozen=True)
class IoUResult:
    """mIoU (in [0, 1]), per-class IoU ``[C]`` (NaN: absent or ignored class) and pixel accuracy."""

    miou: float
    iou: np.ndarray
    pixel_accuracy: float


def class_iou(tp: np.ndarray, target: np.ndarray, pred: np.ndarray, class_mask: np.ndarray) -> np.ndarray:
    """IoU per class ``[..., C]`` from pixel counts ``[..., C]``: true positives, ground-truth
    pixels and predicted pixels of each class. NaN where the union is empty or the class is not
    in ``class_mask``."""
    tp = np.asarray(tp, np.float64)
    union = np.asarray(target, np.float64) + pred - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
    iou[..., ~class_mask] = np.nan
    return iou


def mean_iou(iou: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the finite IoUs (NaN where there is none)."""
    finite = np.isfinite(iou)
    count = finite.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(finite, iou, 0.0).sum(-1) / count, np.nan)


def hungarian_matched(cm: np.ndarray, class_mask: np.ndarray, criterion: str = "iou") -> np.ndarray:
    """``cm [C, C]`` with prediction columns permuted by the best one-to-one matching of the
    ``class_mask`` classes under ``criterion`` (``"iou"``: summed IoU of the pairs; ``"pixels"``:
    summed overlap)."""
    if criterion not in HUNGARIAN_CRITERIA:
        raise ValueError(f"Hungarian criterion must be one of {HUNGARIAN_CRITERIA}, got {criterion!r}")
    classes = np.flatnonzero(class_mask)
    sub = cm[np.ix_(classes, classes)].astype(np.float64)
    if criterion == "iou":  # IoU of ground truth g matched to prediction p
        union = sub.sum(1, keepdims=True) + sub.sum(0, keepdims=True) - sub
        sub = np.divide(sub, union, out=np.zeros_like(sub), where=union > 0)
    rows, cols = linear_sum_assignment(sub, maximize=True)
    matched = cm.copy()
    matched[:, classes[rows]] = cm[:, classes[cols]]
    return matched


def matrix_miou(cm: np.ndarray, class_mask: np.ndarray) -> float:
    """mIoU in percent of one confusion matrix ``[C, C]`` (rows ground truth), by :func:`class_iou`."""
    return float(100 * mean_iou(class_iou(np.diag(cm), cm.sum(1), cm.sum(0), class_mask)))


def images_miou(confusions: ImageConfusions) -> float:
    """The mIoU in percent of all of ``confusions``' images together, by the reported rule: what a
    run's stored ``miou`` must equal (``hbird report`` checks it)."""
    tp, target, pred = confusions.class_counts().sum(0)
    return float(100 * mean_iou(class_iou(tp, target, pred, confusions.class_mask)))


class ConfusionMatrix:
    """Accumulates ``(prediction, target)`` pixel pairs of ``num_classes`` classes.

    Target pixels equal to ``ignore_index`` or outside ``[0, num_classes)`` are not counted.
    ``keep_images``: also keep each image's own matrix (:attr:`images`); an update is then one
    image (``[H, W]``) or a batch of images (``[B, H, W]``).
    """

    def __init__(self, num_classes: int, ignore_index: int | None = 255, keep_images: bool = False):
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)
        self.images = ImageConfusions.empty(num_classes, self.class_mask()) if keep_images else None

    def update(self, pred: Tensor | np.ndarray, target: Tensor | np.ndarray) -> None:
        """Add pixels of ``pred`` and ``target`` (integer arrays of one shape).

        Counted in NumPy: a handful of single-threaded vector ops per image, where torch's
        intra-op thread pool costs milliseconds per small op on a busy machine.
        """
        pred, target = np.asarray(pred), np.asarray(target)
        if pred.shape != target.shape:
            raise ValueError(f"prediction {pred.shape} and target {target.shape} differ")
        if self.images is not None and target.ndim not in (2, 3):
            raise ValueError(f"per-image matrices need [H, W] or [B, H, W] masks, got {target.shape}")
        c = self.num_classes
        n_images = len(target) if self.images is not None and target.ndim == 3 else 1
        pred = pred.reshape(n_images, -1).astype(np.int64, copy=False)
        target = target.reshape(n_images, -1).astype(np.int64, copy=False)
        if pred.size and (pred.min() < 0 or pred.max() >= c):
            raise ValueError(f"predictions must lie in [0, {c})")
        valid = (target >= 0) & (target < c)
        if self.ignore_index is not None:
            valid &= target != self.ignore_index
        image = np.broadcast_to(np.arange(n_images)[:, None], target.shape)
        keys = ((image * c + target) * c + pred)[valid]
        per_image = np.bincount(keys, minlength=n_images * c * c).reshape(n_images, c, c)
        self.matrix += torch.from_numpy(per_image.sum(0))
        if self.images is not None:
            self.images.append(per_image)

    def class_mask(self) -> np.ndarray:
        """Classes that take part in the mean: all but an in-range ignore index."""
        mask = np.ones(self.num_classes, dtype=bool)
        if self.ignore_index is not None and 0 <= self.ignore_index < self.num_classes:
            mask[self.ignore_index] = False
        return mask

    def hungarian_matched(self, criterion: str = "iou") -> np.ndarray:
        """The matrix with prediction columns permuted by the best one-to-one matching under
        ``criterion`` (:func:`hungarian_matched`)."""
        return hungarian_matched(self.matrix.numpy(), self.class_mask(), criterion)

    def compute(self, matching: str = "identity", criterion: str = "iou") -> IoUResult:
        """IoU per class and their mean; ``matching`` is ``"identity"`` or ``"hungarian"`` (with
        ``criterion``, see :meth:`hungarian_matched`)."""
        if matching == "identity":
            cm = self.matrix.numpy()
        elif matching == "hungarian":
            cm = self.hungarian_matched(criterion)
        else:
            raise ValueError(f"matching must be 'identity' or 'hungarian', got {matching!r}")
        tp = np.diag(cm)
        iou = class_iou(tp, cm.sum(1), cm.sum(0), self.class_mask())
        total = cm.sum()
        return IoUResult(float(mean_iou(iou)), iou, float(tp.sum() / total) if total else float("nan"))


def gather_confusions(cm: ConfusionMatrix) -> ConfusionMatrix:
    """Every rank's ``cm`` as one, on every rank: each rank scored its contiguous share of the query
    images (``locatdino.evaluation.ranks``), so the matrices add up and the per-image ones, in rank
    order, are in image order: one process's over all the images. ``cm`` itself in one process."""
    ranks = current_ranks()
    if not ranks.many:
        return cm
    whole = ConfusionMatrix(cm.num_classes, cm.ignore_index, keep_images=cm.images is not None)
    whole.matrix = torch.from_numpy(gather_rows(cm.matrix.numpy()[None]).sum(0))
    if cm.images is not None:
        counts = gather_objects([cm.images.num_images])
        cells = cm.images.cells()
        cells[:, 0] += sum(counts[: ranks.rank])  # this rank's images follow the earlier ranks'
        image, cell, count = gather_rows(cells).T
        whole.images = ImageConfusions(
            cm.num_classes, whole.class_mask(), sum(counts), *(np.ascontiguousarray(a) for a in (image, cell, count))
        )
    return whole
