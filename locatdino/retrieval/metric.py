"""Streaming confusion-matrix mIoU (SPEC §3).

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
label values (ADE20K's 0), is never a class of the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

HUNGARIAN_CRITERIA = ("iou", "pixels")


@dataclass(frozen=True)
class IoUResult:
    """mIoU (in [0, 1]), per-class IoU ``[C]`` (NaN: absent or ignored class) and pixel accuracy."""

    miou: float
    iou: np.ndarray
    pixel_accuracy: float


class ConfusionMatrix:
    """Accumulates ``(prediction, target)`` pixel pairs of ``num_classes`` classes.

    Target pixels equal to ``ignore_index`` or outside ``[0, num_classes)`` are not counted.
    """

    def __init__(self, num_classes: int, ignore_index: int | None = 255):
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.matrix = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, pred: Tensor | np.ndarray, target: Tensor | np.ndarray) -> None:
        """Add pixels of ``pred`` and ``target`` (integer arrays of one shape).

        Counted in NumPy: a handful of single-threaded vector ops per image, where torch's
        intra-op thread pool costs milliseconds per small op on a busy machine.
        """
        pred, target = np.asarray(pred), np.asarray(target)
        if pred.shape != target.shape:
            raise ValueError(f"prediction {pred.shape} and target {target.shape} differ")
        c = self.num_classes
        pred = pred.reshape(-1).astype(np.int64, copy=False)
        target = target.reshape(-1).astype(np.int64, copy=False)
        if pred.size and (pred.min() < 0 or pred.max() >= c):
            raise ValueError(f"predictions must lie in [0, {c})")
        valid = (target >= 0) & (target < c)
        if self.ignore_index is not None:
            valid &= target != self.ignore_index
        keys = (target * c + pred)[valid]
        self.matrix += torch.from_numpy(np.bincount(keys, minlength=c * c).reshape(c, c))

    def merge(self, other: ConfusionMatrix) -> None:
        """Add another matrix of the same classes (e.g. from another process)."""
        self.matrix += other.matrix

    def class_mask(self) -> np.ndarray:
        """Classes that take part in the mean: all but an in-range ignore index."""
        mask = np.ones(self.num_classes, dtype=bool)
        if self.ignore_index is not None and 0 <= self.ignore_index < self.num_classes:
            mask[self.ignore_index] = False
        return mask

    def hungarian_matched(self, criterion: str = "iou") -> np.ndarray:
        """The matrix with prediction columns permuted by the best one-to-one matching under
        ``criterion`` (``"iou"``: summed IoU of the pairs; ``"pixels"``: summed overlap)."""
        if criterion not in HUNGARIAN_CRITERIA:
            raise ValueError(f"Hungarian criterion must be one of {HUNGARIAN_CRITERIA}, got {criterion!r}")
        cm = self.matrix.numpy()
        classes = np.flatnonzero(self.class_mask())
        sub = cm[np.ix_(classes, classes)].astype(np.float64)
        if criterion == "iou":  # IoU of ground truth g matched to prediction p
            union = sub.sum(1, keepdims=True) + sub.sum(0, keepdims=True) - sub
            sub = np.divide(sub, union, out=np.zeros_like(sub), where=union > 0)
        rows, cols = linear_sum_assignment(sub, maximize=True)
        matched = cm.copy()
        matched[:, classes[rows]] = cm[:, classes[cols]]
        return matched

    def compute(self, matching: str = "identity", criterion: str = "iou") -> IoUResult:
        """IoU per class and their mean; ``matching`` is ``"identity"`` or ``"hungarian"`` (with
        ``criterion``, see :meth:`hungarian_matched`)."""
        if matching == "identity":
            cm = self.matrix.numpy()
        elif matching == "hungarian":
            cm = self.hungarian_matched(criterion)
        else:
            raise ValueError(f"matching must be 'identity' or 'hungarian', got {matching!r}")
        cm = cm.astype(np.float64)
        tp = np.diag(cm)
        union = cm.sum(0) + cm.sum(1) - tp
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = np.where(union > 0, tp / union, np.nan)
        iou[~self.class_mask()] = np.nan
        miou = float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan")
        total = cm.sum()
        return IoUResult(miou, iou, float(tp.sum() / total) if total else float("nan"))
