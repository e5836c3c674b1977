"""DINOv2's segmentation evaluation: sliding windows at one or several scales, with flips
(``linprobe --variant dinov2 | dinov2-ms``, docs/evaluation.md).

For each query image, as MMSegmentation's ``MultiScaleFlipAug`` + ``EncoderDecoder.aug_test`` run
by DINOv2's configs (and DINOv3's ``eval/segmentation/eval.py``):

1. for each scale ``r``: the image resized, keeping its ratio, to short side ``int(S · r)`` (long
   side at most 4× that for the one-scale ``dinov2``, unbounded for ``dinov2-ms``; bilinear, no
   antialiasing), and, with ``flip``, its mirror image too;
2. each view is covered by ``S × S`` windows ``stride`` apart (the last flush with the edge; the
   whole side when shorter than ``S``) (:func:`slide_logits`); each window goes through the frozen
   backbone and the head, its logits upsampled to the window; overlapping windows' logits are
   averaged;
3. every view's logits are un-flipped, resized bilinearly to the *label's* size (the original
   image: labels are never resized), turned into probabilities by a softmax over the classes and
   averaged over the views (:func:`merge_views`); the prediction is the arg-max.

A window whose side is not a multiple of the patch (an image or a scale smaller than ``S``) is
padded at the bottom / right with the mean colour and its logits cropped back, as the paper's
evaluation view (DINOv2's notebook pads both sides instead).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import InterpolationMode

from locatdino.common.progress import progress
from locatdino.evaluation.linprobe.head import bilinear_resize
from locatdino.evaluation.linprobe.transforms import keep_ratio_size, pad_to
from locatdino.evaluation.linprobe.views import collate_items
from locatdino.evaluation.metric import ConfusionMatrix
from locatdino.evaluation.phase_clock import PhaseClock
from locatdino.evaluation.views import load_pair

Predict = Callable[[Tensor], Tensor]  # uint8 images [n, 3, h, w] → logits [n, C, h, w]


def scaled_size(height: int, width: int, size: int, scale: float, long_to_short: float) -> tuple[int, int]:
    """``(h, w)`` of an image at ``scale``: short side ``int(size · scale)`` (MMSegmentation truncates
    the scaled ``img_scale``), long side at most ``long_to_short`` times it."""
    short = int(size * scale)
    return keep_ratio_size(height, width, long_to_short * short, short)


def windows(height: int, width: int, crop: int, stride: int) -> list[tuple[int, int, int, int]]:
    """``(top, left, bottom, right)`` of the sliding windows over ``height × width``: a grid
    ``stride`` apart, the last row / column moved back to end at the edge, each side at most ``crop``."""

    def starts(side: int) -> list[int]:
        count = max(side - crop + stride - 1, 0) // stride + 1
        return [max(min(i * stride + crop, side) - crop, 0) for i in range(count)]

    return [
        (top, left, min(top + crop, height), min(left + crop, width))
        for top in starts(height)
        for left in starts(width)
    ]


def slide_logits(
    predict: Predict, image: Tensor, crop: int, stride: int, patch: int, num_classes: int, batch_size: int = 16
) -> Tensor:
    """Logits ``[C, H, W]`` of a uint8 image ``[3, H, W]``: every window's (``batch_size`` at a
    time), averaged where they overlap."""
    height, width = image.shape[-2:]
    boxes = windows(height, width, crop, stride)
    h, w = boxes[0][2] - boxes[0][0], boxes[0][3] - boxes[0][1]  # every window has this size
    padded_h, padded_w = math.ceil(h / patch) * patch, math.ceil(w / patch) * patch
    total = torch.zeros(num_classes, height, width)
    count = torch.zeros(1, height, width)
    for start in range(0, len(boxes), batch_size):
        chunk = boxes[start : start + batch_size]
        batch = torch.stack([pad_to(image[:, t:b, x0:x1], None, padded_h, padded_w)[0] for t, x0, b, x1 in chunk])
        for (t, x0, b, x1), one in zip(chunk, predict(batch)[:, :, :h, :w].float().cpu()):
            total[:, t:b, x0:x1] += one
            count[:, t:b, x0:x1] += 1
    return total / count


def merge_views(view_logits: Iterable[tuple[Tensor, bool]], size: tuple[int, int]) -> Tensor:
    """Mean class probabilities ``[C, H, W]`` of views ``(logits [C, h, w], flipped)``: each
    un-flipped, resized to ``size`` (bilinear, ``align_corners=False``), soft-maxed, then averaged.
    Views are read one at a time (a generator keeps one view's logits in memory, not ten)."""
    total, count = None, 0
    for logits, flipped in view_logits:
        probs = bilinear_resize(logits.flip(-1) if flipped else logits, size).softmax(0)
        total, count = probs if total is None else total + probs, count + 1
    return total / count


class ScaledViews(Dataset):
    """``([view uint8 [3, h, w] per scale], mask at original resolution)``, or None for a corrupt sample."""

    def __init__(self, dataset: Any, size: int, scales: Sequence[float], long_to_short: float):
        self.dataset, self.size, self.scales, self.long_to_short = dataset, size, tuple(scales), long_to_short

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[list[Tensor], Tensor] | None:
        pair = load_pair(self.dataset, index)
        if pair is None:
            return None
        image, mask = pair
        views = []
        for scale in self.scales:
            size = scaled_size(*image.shape[-2:], self.size, scale, self.long_to_short)
            views.append(TF.resize(image, list(size), interpolation=InterpolationMode.BILINEAR, antialias=False))
        return views, mask


def evaluate_views(
    predict: Predict,
    dataset: Any,
    *,
    crop: int,
    stride: int,
    patch: int,
    scales: Sequence[float],
    flip: bool,
    long_to_short: float,
    num_workers: int,
    batch_size: int = 16,
    show_progress: bool = True,
    clock: PhaseClock | None = None,
) -> tuple[ConfusionMatrix, ConfusionMatrix, int]:
    """Score ``predict`` on every image of ``dataset`` (module docs): the confusion matrices of the
    merged prediction and of the first scale alone, unflipped (the one-scale score; one matrix per
    image in ``.images`` of the first), and the number of skipped samples."""
    clock = clock or PhaseClock()
    ignore, classes = dataset.ignore_index, dataset.num_classes
    merged = ConfusionMatrix(classes, ignore, keep_images=True)
    single = ConfusionMatrix(classes, ignore)
    views = ScaledViews(dataset, crop, scales, long_to_short)
    loader = DataLoader(views, batch_size=1, num_workers=num_workers, collate_fn=collate_items)
    skipped, flips = 0, (False, True) if flip else (False,)
    for items, n_bad in clock.iterate(
        progress(loader, desc="evaluate", disable=not show_progress, leave=False), "data"
    ):
        skipped += n_bad
        for scaled, mask in items:
            size = tuple(mask.shape)

            def slide(image: Tensor) -> Tensor:
                with clock("features"):
                    return slide_logits(predict, image, crop, stride, patch, classes, batch_size)

            logits = ((slide(v.flip(-1) if f else v), f) for v in scaled for f in flips)  # one view at a time
            first = next(logits)
            merged.update(_labels(merge_views(itertools.chain([first], logits), size), ignore), mask)
            single.update(_labels(merge_views([first], size), ignore), mask)
    return merged, single, skipped


def _labels(probs: Tensor, ignore_index: int | None) -> Tensor:
    """Class ids ``[H, W]`` of probabilities ``[C, H, W]``; an ignore value that is a label is never predicted."""
    if ignore_index is not None and 0 <= ignore_index < probs.shape[0]:
        probs = probs.clone()
        probs[ignore_index] = -1
    return probs.argmax(0)


def logits_of(extractor: Callable[[Tensor], Tensor], head: torch.nn.Module) -> Predict:
    """The :data:`Predict` of a frozen token extractor (``[n, h, w, D]``) and a head, logits at the input's size."""

    @torch.no_grad()
    def predict(images: Tensor) -> Tensor:
        tokens = extractor(images).permute(0, 3, 1, 2).clone()
        return head(tokens, tuple(images.shape[-2:]))

    return predict
