"""Crash-safe local checkpoint writes for Lightning.

Lightning's ``TorchCheckpointIO`` serialises into memory and writes through an fsspec
transaction whose temporary file lives in the system temp folder; when that folder is on
another filesystem than the checkpoint (a tmpfs ``/tmp``, a network scratch folder) the final
``shutil.move`` falls back to copy-then-delete, and a crash mid-copy leaves a truncated
``last.ckpt``. This plugin writes next to the target, fsyncs, then ``os.replace``s: readers see
the old file or the new one, never a partial one. Remote URLs keep Lightning's own path.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from locatdino.common.output_files import atomic_write


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through :func:`locatdino.common.output_files.atomic_write` (temporary, fsync, rename)."""
    atomic_write(path, lambda f: torch.save(obj, f))


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves go through :func:`atomic_torch_save`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)
