"""Frozen class-token embeddings of a labelled split, as DINO's k-NN evaluation computes them.

Each image goes through the evaluation transform of the reference (``Resize(256, bicubic)``,
``CenterCrop(224)``, ImageNet mean / std; at another ``input_size`` both sides scale by it, as
timm's ``crop_pct = 224 / 256``) and the backbone's image embedding is kept: ``model(x)`` with
``num_classes=0``, the class token after the final norm (PRR-refined for LocAtViT), L2-normalised.

The embeddings of a split are computed once per model (every ``k`` reads them) into an
``[N, D]`` float32 array held in RAM up to ``max_ram_bytes`` and memory-mapped in a temporary
folder beyond (ImageNet's 1.28 M train images make 2 GB at D = 384), deleted when the block
ends. Images that do not decode are skipped, counted and named; the rest are scored.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from locatdino.common.output_files import feature_rows
from locatdino.common.progress import progress
from locatdino.data.transforms.classification import ClassificationTransform
from locatdino.evaluation.class_splits import LabelledImages
from locatdino.evaluation.features import eval_mode
from locatdino.evaluation.precision import autocast, encoder_for
from locatdino.evaluation.ranks import Ranks, current_ranks, gather_objects, gather_rows, gathered_rows

CROP_FRACTION = 224 / 256  # the reference's CenterCrop(224) of a Resize(256)


def eval_transform(input_size: int) -> Any:
    """The reference's evaluation view at ``input_size`` px: timm's resize (short side
    ``floor(input_size * 256 / 224)``, bicubic), centre crop, ImageNet normalisation."""
    return ClassificationTransform(input_size=input_size, crop_pct=CROP_FRACTION, interpolation="bicubic").eval()


@dataclass
class Embeddings:
    """``features [n, D]`` (L2-normalised float32) and ``labels [n]`` of the images that decoded;
    ``kept [n]`` their indices in the split, ``skipped`` the names of those that did not."""

    features: np.ndarray
    labels: np.ndarray
    kept: np.ndarray
    skipped: list[str] = field(default_factory=list)


class _Views:
    """``(index, view or None)`` per image: a decode failure becomes None, skipped by the loader."""

    def __init__(self, images: LabelledImages, input_size: int):
        self.images, self.transform = images, eval_transform(input_size)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None]:
        try:
            return i, self.transform(self.images.load(i))
        except (ValueError, OSError):  # DecodeError, truncated or unreadable files
            return i, None


def _collate(batch: list[tuple[int, torch.Tensor | None]]) -> tuple[list[int], torch.Tensor | None, list[int]]:
    good = [(i, view) for i, view in batch if view is not None]
    failed = [i for i, view in batch if view is None]
    return [i for i, _ in good], torch.stack([v for _, v in good]) if good else None, failed


@contextlib.contextmanager
def class_token_embeddings(
    model: nn.Module,
    images: LabelledImages,
    input_size: int,
    *,
    precision: str = "fp32",
    batch_size: int = 64,
    workers: int | None = None,
    cache_dir: str | None = None,
    max_ram_bytes: int = 4 << 30,
    desc: str = "embeddings",
    show_progress: bool = True,
    shared: bool = False,
) -> Iterator[Embeddings]:
    """The :class:`Embeddings` of ``images`` under ``model`` (on its device, in ``precision``),
    valid for the block (a memory-mapped array is deleted at its end). ``shared``: each rank of the
    process group encodes its share and every rank gets all of them (``locatdino.evaluation.ranks``)."""
    share = (current_ranks() if shared else Ranks()).share(len(images))
    whole, images = images, images.subset(np.arange(share.start, share.stop)) if len(share) < len(images) else images
    device = next(model.parameters()).device
    encoder, precision = encoder_for(model, precision, device)
    if workers is None:  # one beside a CPU encoder (more steal its cores), up to 8 beside a GPU
        workers = 1 if device.type == "cpu" else min(8, os.cpu_count() or 1)
    loader = DataLoader(_Views(images, input_size), batch_size=batch_size, num_workers=workers, collate_fn=_collate)
    filled, failed = np.zeros(len(images), bool), []
    with feature_rows(len(images), model.num_features, cache_dir, max_ram_bytes, "knn-features") as rows:
        with eval_mode(encoder), torch.inference_mode(), autocast(precision, device):
            for index, batch, bad in progress(loader, desc=desc, unit="batch", disable=not show_progress):
                failed += bad
                if batch is not None:
                    rows[index] = F.normalize(encoder(batch.to(device)).float(), dim=1).cpu().numpy()
                    filled[index] = True
        kept = np.flatnonzero(filled)
        with gathered_rows(
            rows if len(kept) == len(images) else rows[kept], cache_dir, max_ram_bytes, "knn-all"
        ) as all_rows:
            kept = gather_rows(kept + share.start)
            skipped = gather_objects([images.name(i) for i in sorted(failed)])
            yield Embeddings(all_rows, whole.labels[kept], kept, skipped)
