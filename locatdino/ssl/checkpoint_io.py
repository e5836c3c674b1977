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
import uuid
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temporary file in ``path``'s folder, fsync, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, like open()
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves go through :func:`atomic_torch_save`."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)
