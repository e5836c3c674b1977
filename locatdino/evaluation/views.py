"""What the frozen encoder sees: memory views and query views of a segmentation dataset.

Datasets follow the protocol of INTERFACES.md: ``ds[i] -> (PIL RGB image, mask [H, W])`` with
``num_classes``, ``ignore_index`` and ``class_names``. Both wrappers are map-style datasets for a
``DataLoader`` (workers decode and augment in parallel). A sample that fails to decode or whose
mask does not match its image is skipped with a warning naming it and counted; never fatal.
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


def load_pair(dataset: Any, index: int) -> tuple[Tensor, Tensor] | None:
    """``(image uint8 [3, H, W], mask int32 [H, W])`` of ``dataset[index]``, or None (with a
    warning) when the sample is corrupt."""
    try:
        image, mask = dataset[index]
        image = TF.pil_to_tensor(image.convert("RGB"))
        mask = torch.from_numpy(np.asarray(mask, dtype=np.int32))  # 16-bit PNG labels fit
    except (OSError, ValueError, SyntaxError, TypeError) as err:
        warnings.warn(f"skipping sample {index} of {type(dataset).__name__}: {err}", stacklevel=2)
        return None
    if mask.shape != image.shape[-2:]:
        warnings.warn(
            f"skipping sample {index} of {type(dataset).__name__}: mask {tuple(mask.shape)} does not "
            f"match image {tuple(image.shape[-2:])}",
            stacklevel=2,
        )
        return None
    return image, mask


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
