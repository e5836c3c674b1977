"""Frozen features of every training image, computed once: the dense probe's fast path.

With augmentation off every pass over an image feeds the head the same patch tokens, so they are
computed once and the head trains on the stored copy (docs/evaluation.md: the head then trains in seconds
to minutes instead of re-running the backbone every iteration). ``features [N, D, h, w]`` float32
and ``targets [N, S, S]`` int16 (:data:`~locatdino.evaluation.linprobe.transforms.IGNORE` included) stay in
RAM up to ``max_ram_bytes`` and are memory-mapped files otherwise (ADE20K's 20,210 images at
512 px make 32 GB of ViT-S tokens), in a temporary folder that :meth:`close` deletes, with their
disk space claimed before the first image is encoded. The folder is named as every locatdino
temporary (:func:`~locatdino.common.output_files.temporary_sibling`), so one left by a killed run
(SIGKILL, a node failure) is removed by the next store allocated in the same place.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from locatdino.common.output_files import make_temporary_dir, remove_stale_temporaries, reserved_memmap

TARGET_DTYPE = np.int16


class FeatureStore:
    """``features [N, D, h, w]`` and ``targets [N, S, S]`` of ``N`` images, filled by :meth:`put`."""

    def __init__(
        self,
        count: int,
        dim: int,
        grid: int,
        size: int,
        directory: str | Path | None = None,
        max_ram_bytes: int = 4 << 30,
    ):
        shapes = {"features": ((count, dim, grid, grid), np.float32), "targets": ((count, size, size), TARGET_DTYPE)}
        nbytes = sum(np.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
        self.folder: Path | None = None
        if nbytes <= max_ram_bytes:
            self.features, self.targets = (np.zeros(shape, dtype) for shape, dtype in shapes.values())
        else:
            parent = Path(directory if directory is not None else tempfile.gettempdir())
            remove_stale_temporaries(parent)
            self.folder = make_temporary_dir(parent / "linprobe-features")
            try:
                self.features, self.targets = (
                    reserved_memmap(self.folder / f"{name}.bin", dtype, shape)
                    for name, (shape, dtype) in shapes.items()
                )
            except BaseException:
                self.close()
                raise
        self.filled = np.zeros(count, dtype=bool)

    @property
    def memory_mapped(self) -> bool:
        return self.folder is not None

    @property
    def nbytes(self) -> int:
        return int(self.features.nbytes + self.targets.nbytes)

    def put(self, indices: Iterable[int], features: Tensor, targets: Tensor) -> None:
        """Store images ``indices``: features ``[B, D, h, w]``, targets ``[B, S, S]``."""
        idx = np.fromiter(indices, dtype=np.int64)
        self.features[idx] = features.float().cpu().numpy()
        self.targets[idx] = targets.cpu().numpy().astype(TARGET_DTYPE)
        self.filled[idx] = True

    def batch(self, indices: np.ndarray, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Features and int64 targets of the stored images ``indices`` (any order, repeats allowed;
        ``filled`` says which images were stored: one that failed to decode never is)."""
        order = np.asarray(indices)
        feats = torch.from_numpy(np.ascontiguousarray(self.features[order]))
        targets = torch.from_numpy(self.targets[order].astype(np.int64))
        return feats.to(device, non_blocking=True), targets.to(device, non_blocking=True)

    def close(self) -> None:
        """Release the arrays and delete the memory-mapped files."""
        self.features = self.targets = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
