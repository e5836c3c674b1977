"""The labelled patch memory of Hummingbird evaluation (docs/evaluation.md).

Two dense arrays, never per-patch Python objects: ``features [N, D]`` (L2-normalised, float32 or
float16) and ``labels [N, C]`` (soft labels, float16 — patch fractions k/256 of a 16 px patch are
exact in float16). Held in RAM, or written straight to raw files in a directory through
``np.memmap`` so a 10M-patch memory (7.7 GB of float16 ViT-S features) costs page cache, not
process memory. A directory holds ``features.bin``, ``labels.bin`` and ``meta.json`` (shapes,
dtypes, provenance) and is published atomically: built under a temporary name, then renamed.
Its files get their full size on disk before the first patch is encoded (``posix_fallocate``):
a memory-mapped file that outgrows the disk would otherwise kill the process with SIGBUS
half-way; a disk too small fails at once, in one line, leaving no staging folder.
A bank folder is replaced only when it is empty or holds an earlier bank (:func:`check_bank_folder`):
a folder holding anything else, or a file, is refused, never moved aside and deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from locatdino.common.output_files import (
    make_temporary_dir,
    remove_stale_temporaries,
    reserved_memmap,
    temporary_sibling,
)

LABEL_DTYPE = np.float16
BANK_FILES = ("features.bin", "labels.bin", "meta.json")


def check_bank_folder(directory: str | os.PathLike) -> None:
    """``ValueError`` unless ``directory`` is absent, an empty folder or a bank written here: a
    new bank replaces the folder whole, so anything else in it would be lost."""
    path = Path(directory)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise ValueError(f"memory-bank folder {path} is a file: give a folder name (the bank replaces it whole)")
    entries = sorted(e.name for e in path.iterdir())
    foreign = [name for name in entries if name not in BANK_FILES]
    if foreign or (entries and "meta.json" not in entries):
        shown = ", ".join((foreign or entries)[:3]) + (", …" if len(foreign or entries) > 3 else "")
        raise ValueError(
            f"memory-bank folder {path} holds files that are not a memory bank ({shown}): a bank "
            "replaces its folder whole, so choose an empty or new folder"
        )


class MemoryBank:
    """Patch features and soft labels, appended batch by batch up to a fixed capacity.

    Use :meth:`allocate` to build one, :meth:`append` per batch, then :meth:`finish`;
    :meth:`load` reopens a saved directory memory-mapped (read-only).
    """

    def __init__(self, features: np.ndarray, labels: np.ndarray, size: int, meta: dict[str, Any]):
        self._features = features
        self._labels = labels
        self.size = size
        self.meta = meta
        self._directory: Path | None = None
        self._staging: Path | None = None

    @classmethod
    def allocate(
        cls,
        capacity: int,
        dim: int,
        num_classes: int,
        dtype: str = "float32",
        directory: str | os.PathLike | None = None,
        meta: dict[str, Any] | None = None,
    ) -> MemoryBank:
        """An empty bank for up to ``capacity`` patches; on disk under ``directory`` if given."""
        if dtype not in ("float32", "float16"):
            raise ValueError(f"memory dtype must be 'float32' or 'float16', got {dtype!r}")
        meta = {**(meta or {}), "dim": dim, "num_classes": num_classes, "dtype": dtype}
        if directory is None:
            feats = np.empty((capacity, dim), dtype=dtype)
            labels = np.empty((capacity, num_classes), dtype=LABEL_DTYPE)
            return cls(feats, labels, 0, meta)
        directory = Path(directory)
        check_bank_folder(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(directory.parent)
        staging = make_temporary_dir(directory)
        try:
            feats = reserved_memmap(staging / "features.bin", dtype, (max(capacity, 1), dim))
            labels = reserved_memmap(staging / "labels.bin", LABEL_DTYPE, (max(capacity, 1), num_classes))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        bank = cls(feats, labels, 0, meta)
        bank._directory, bank._staging = directory, staging
        return bank

    @property
    def capacity(self) -> int:
        return self._features.shape[0]

    @property
    def features(self) -> np.ndarray:
        """``[N, D]`` L2-normalised features (a view, memory-mapped for directory banks)."""
        return self._features[: self.size]

    @property
    def labels(self) -> np.ndarray:
        """``[N, C]`` float16 soft labels."""
        return self._labels[: self.size]

    @property
    def dim(self) -> int:
        return self.meta["dim"]

    @property
    def num_classes(self) -> int:
        return self.meta["num_classes"]

    @property
    def nbytes(self) -> int:
        return self.features.nbytes + self.labels.nbytes

    def __len__(self) -> int:
        return self.size

    def append(self, features: Tensor, labels: Tensor) -> None:
        """Store ``features [n, D]`` (already L2-normalised) and ``labels [n, C]``."""
        n = features.shape[0]
        if labels.shape[0] != n or features.shape[1] != self.dim or labels.shape[1] != self.num_classes:
            raise ValueError(
                f"append expects features [n, {self.dim}] and labels [n, {self.num_classes}], "
                f"got {tuple(features.shape)} and {tuple(labels.shape)}"
            )
        if self.size + n > self.capacity:
            raise ValueError(f"memory bank full: {self.size} + {n} patches > capacity {self.capacity}")
        end = self.size + n
        self._features[self.size : end] = features.detach().cpu().numpy().astype(self._features.dtype)
        self._labels[self.size : end] = labels.detach().cpu().numpy().astype(LABEL_DTYPE)
        self.size = end

    def reserve(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n`` rows of features and labels, counted as stored, for a writer that fills them
        in place (the ranks' gathered shares of a memory, ``locatdino.evaluation.ranks.gather_rows``)."""
        if self.size + n > self.capacity:
            raise ValueError(f"memory bank full: {self.size} + {n} patches > capacity {self.capacity}")
        begin, self.size = self.size, self.size + n
        return self._features[begin : self.size], self._labels[begin : self.size]

    def gather_labels(self, ids: np.ndarray) -> Tensor:
        """Soft labels of neighbour ids ``[...]`` as float32 ``[..., C]``; ids < 0 (FAISS' "no
        result") give zero rows."""
        flat = ids.reshape(-1)
        rows = torch.from_numpy(self._labels[np.clip(flat, 0, None)].astype(np.float32))
        rows[torch.from_numpy(flat < 0)] = 0.0
        return rows.view(*ids.shape, self.num_classes)

    def gather_features(self, ids: np.ndarray) -> Tensor:
        """Stored features of ids ``[...]`` as float32 ``[..., D]`` (ids < 0 give zero rows)."""
        flat = ids.reshape(-1)
        rows = torch.from_numpy(self._features[np.clip(flat, 0, None)].astype(np.float32))
        rows[torch.from_numpy(flat < 0)] = 0.0
        return rows.view(*ids.shape, self.dim)

    def finish(self) -> MemoryBank:
        """Seal the bank: directory banks are trimmed to their size, flushed, described in
        ``meta.json`` and renamed into place (a previous bank there is replaced only now)."""
        self.meta["size"] = self.size
        if self._staging is None:
            return self
        self._features.flush()
        self._labels.flush()
        del self._features, self._labels
        for name, width, dtype in (
            ("features.bin", self.meta["dim"], np.dtype(self.meta["dtype"])),
            ("labels.bin", self.meta["num_classes"], np.dtype(LABEL_DTYPE)),
        ):
            os.truncate(self._staging / name, self.size * width * dtype.itemsize)
        (self._staging / "meta.json").write_text(json.dumps(self.meta, indent=2))
        _replace_dir(self._staging, self._directory)
        reopened = MemoryBank.load(self._directory)
        self.__dict__.update(reopened.__dict__)
        return self

    def save(self, directory: str | os.PathLike) -> Path:
        """Write an in-RAM bank to ``directory`` (atomically) in the :meth:`load` format."""
        out = MemoryBank.allocate(self.size, self.dim, self.num_classes, self.meta["dtype"], directory, self.meta)
        out.append(torch.from_numpy(np.asarray(self.features)), torch.from_numpy(np.asarray(self.labels)))
        out.finish()
        return Path(directory)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> MemoryBank:
        """Open a saved bank memory-mapped, read-only."""
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: not a memory bank directory (no meta.json)")
        meta = json.loads(meta_path.read_text())
        n, d, c = meta["size"], meta["dim"], meta["num_classes"]
        if n == 0:
            return cls(np.empty((0, d), meta["dtype"]), np.empty((0, c), LABEL_DTYPE), 0, meta)
        feats = np.memmap(directory / "features.bin", dtype=meta["dtype"], mode="r", shape=(n, d))
        labels = np.memmap(directory / "labels.bin", dtype=LABEL_DTYPE, mode="r", shape=(n, c))
        bank = cls(feats, labels, n, meta)
        bank._directory = directory
        return bank


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` onto ``dst``; an existing ``dst`` (an earlier bank, checked again now) is
    moved aside first and deleted last."""
    check_bank_folder(dst)
    old = None
    if dst.exists():
        old = temporary_sibling(dst)
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
