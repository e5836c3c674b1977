"""What the frozen encoder sees: memory views and query views of a segmentation dataset.

Datasets follow the protocol of INTERFACES.md: ``ds[i] -> (PIL RGB image, mask [H, W])`` with
``num_classes``, ``ignore_index`` and ``class_names``. Both wrappers are map-style datasets for a
``DataLoader`` (workers decode and augment in parallel). A sample that fails to decode, whose
mask does not match its image, or whose mask holds a label outside ``[0, num_classes)`` that is
not the ignore index (masks of another dataset, a grayscale rendering) is skipped with a warning
naming it and counted; never fatal. A split where *every* sample is so is refused before the
work by :func:`check_usable`, naming the first file and what is wrong with it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from torch import Tensor
from torch.utils.data import Dataset

from locatdino.evaluation.augment import PairedAugmentation, resize_image


def view_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The random stream of one memory view, a function of (seed, epoch, image) only — so views
    do not depend on worker count or order, and every model compared sees the same crops."""
    state = np.random.SeedSequence([seed, epoch, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class BadSample(ValueError):
    """A sample of a labelled split that cannot be used; the message names it and says why."""


def sample_name(dataset: Any, index: int) -> str:
    """The file (or ``shard:key``) of ``dataset[index]`` where its reader tells, through subsets."""
    while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # SubsetSplit, CachedSplit
        dataset, index = dataset.dataset, int(dataset.indices[index])
    source = getattr(dataset, "sample_source", None)
    return source(index) if source is not None else f"sample {index} of {type(dataset).__name__}"


def read_pair(dataset: Any, index: int) -> tuple[Tensor, Tensor]:
    """``(image uint8 [3, H, W], mask int32 [H, W])`` of ``dataset[index]``; :class:`BadSample`
    naming it when it does not decode, its mask does not match the image or holds a label that
    is neither a class nor the ignore index."""
    try:
        image, mask = dataset[index]
        image = TF.pil_to_tensor(image.convert("RGB"))
        mask = torch.from_numpy(np.asarray(mask, dtype=np.int32))  # 16-bit PNG labels fit
    except (OSError, ValueError, SyntaxError, TypeError) as err:
        raise BadSample(f"{sample_name(dataset, index)}: {err}") from None
    if mask.shape != image.shape[-2:]:
        raise BadSample(
            f"{sample_name(dataset, index)}: mask {tuple(mask.shape)} does not match image {tuple(image.shape[-2:])}"
        )
    c, ignore = dataset.num_classes, dataset.ignore_index
    if mask.numel() and (int(mask.min()) < 0 or int(mask.max()) >= c):
        values = mask.unique()
        bad = values[((values < 0) | (values >= c)) & (values != ignore if ignore is not None else True)]
        if len(bad):
            shown = ", ".join(map(str, bad[:5].tolist())) + (", ..." if len(bad) > 5 else "")
            raise BadSample(
                f"{sample_name(dataset, index)}: label {shown} out of range: classes are 0..{c - 1}"
                + (f", ignore index {ignore}" if ignore is not None else "")
            )
    return image, mask


def load_pair(dataset: Any, index: int) -> tuple[Tensor, Tensor] | None:
    """:func:`read_pair`, or None with a warning naming the sample when it is bad."""
    try:
        return read_pair(dataset, index)
    except BadSample as err:
        warnings.warn(f"skipping {err}", stacklevel=2)
        return None


def check_usable(dataset: Any, what: str) -> None:
    """:class:`BadSample` (one line naming ``what``, e.g. ``"--val-split val"``, and the first bad
    file) unless some sample of ``dataset`` can be used. Reads up to the first good sample, in
    practice the first: only a split where every sample is bad (masks of the wrong size
    everywhere, another dataset's labels) is read through, which costs a decode per image and
    no forward pass, instead of a run whose scores are empty."""
    first = None
    for index in range(len(dataset)):
        try:
            read_pair(dataset, index)
            return
        except BadSample as err:
            first = first or str(err)
    raise BadSample(
        f"{what}: none of its {len(dataset)} images can be used (first: {first})" if first else f"{what} has no image"
    )


class MemoryViews(Dataset):
    """``epochs`` augmented passes over a labelled split: item ``e·N + i`` is view ``e`` of image
    ``i``, as ``(image uint8 [3, S, S], mask int32 [S, S])`` or None if corrupt."""

    def __init__(self, dataset: Any, augmentation: PairedAugmentation, epochs: int = 1, seed: int = 0):
        self.dataset, self.augmentation, self.epochs, self.seed = dataset, augmentation, epochs, seed

    def __len__(self) -> int:
        return len(self.dataset) * self.epochs

    def __getitem__(self, item: int) -> tuple[Tensor, Tensor] | None:
        epoch, index = divmod(item, len(self.dataset))
        pair = load_pair(self.dataset, index)
        if pair is None:
            return None
        return self.augmentation(*pair, view_generator(self.seed, epoch, index))


class QueryViews(Dataset):
    """Evaluation images resized to ``size`` with their masks at original resolution:
    ``(image uint8 [3, S, S], mask int32 [H, W])`` or None if corrupt."""

    def __init__(self, dataset: Any, size: int):
        self.dataset, self.size = dataset, size

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor] | None:
        pair = load_pair(self.dataset, index)
        if pair is None:
            return None
        image, mask = pair
        return resize_image(image, self.size), mask


def collate_views(batch: list[tuple[Tensor, Tensor] | None]) -> tuple[Tensor, list[Tensor], int]:
    """``(images [B, 3, S, S] uint8, masks: list of B tensors, skipped: int)``; corrupt samples
    (None) are dropped and counted."""
    pairs = [b for b in batch if b is not None]
    skipped = len(batch) - len(pairs)
    if not pairs:
        return torch.empty(0, 3, 0, 0, dtype=torch.uint8), [], skipped
    images = torch.stack([p[0] for p in pairs])
    return images, [p[1] for p in pairs], skipped
