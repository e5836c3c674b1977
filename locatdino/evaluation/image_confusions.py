"""One confusion matrix per query image, stored sparse: what a paired bootstrap resamples (docs/evaluation.md).

A query image holds a handful of classes, so its ``C×C`` matrix has few non-zero cells: ADE20K's
2,000 validation images × 150² cells would be 45 M integers dense, a few hundred thousand sparse.
The cells are kept as three flat arrays (image, ``target · C + prediction``, pixel count), written
next to a run's ``results.json`` as one compressed ``.npz`` (:meth:`save`, :meth:`load`).

Hummingbird and the dense linear probe both keep theirs with ``ConfusionMatrix(keep_images=True)``
and write them in this one format (:data:`CONFUSION_FILE` beside ``results.json``); any other
producer of per-image matrices can build one (:meth:`from_matrices`).
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix

from locatdino.common.errors import first_line
from locatdino.common.input_files import read_bounded
from locatdino.common.output_files import atomic_write

CONFUSION_FILE = "per_image_confusion.npz"  # its name beside a run's results.json (hbird, linprobe)
# 2,000 ADE20K images hold about 10 MB; a file (or its arrays unpacked) past this is not one
MAX_BYTES = 2 << 30


@dataclass
class ImageConfusions:
    """Sparse per-image confusion matrices of ``num_classes`` classes (rows: ground truth,
    columns: prediction); ``class_mask [C]`` marks the classes of the mean (all but an in-range
    ignore index)."""

    num_classes: int
    class_mask: np.ndarray
    num_images: int = 0
    image: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [nnz] image of each cell
    cell: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [nnz] target * C + prediction
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [nnz] pixels
    _pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def empty(cls, num_classes: int, class_mask: np.ndarray | None = None) -> ImageConfusions:
        mask = np.ones(num_classes, bool) if class_mask is None else np.asarray(class_mask, bool)
        if mask.shape != (num_classes,):
            raise ValueError(f"class mask of shape {mask.shape} for {num_classes} classes")
        return cls(num_classes, mask)

    @classmethod
    def from_matrices(
        cls, matrices: Iterable[np.ndarray] | np.ndarray, class_mask: np.ndarray | None = None
    ) -> ImageConfusions:
        """From dense per-image matrices (a list of ``[C, C]`` or one ``[N, C, C]`` array)."""
        stack = np.stack([np.asarray(m) for m in matrices]) if not isinstance(matrices, np.ndarray) else matrices
        if stack.ndim != 3 or stack.shape[1] != stack.shape[2]:
            raise ValueError(f"per-image confusion matrices must be [N, C, C], got {stack.shape}")
        confusions = cls.empty(stack.shape[1], class_mask)
        confusions.append(stack)
        confusions._merge()
        return confusions

    def append(self, matrices: np.ndarray) -> None:
        """Add the dense matrices ``[B, C, C]`` of the next ``B`` images."""
        c = self.num_classes
        flat = np.asarray(matrices, np.int64).reshape(len(matrices), c * c)
        if (flat < 0).any():
            raise ValueError("confusion matrices hold pixel counts: negative entry")
        image, cell = np.nonzero(flat)
        self._pending.append((image + self.num_images, cell, flat[image, cell]))
        self.num_images += len(flat)

    def _merge(self) -> None:
        """Join the cells appended since the last read (one concatenation, not one per image)."""
        if self._pending:
            image, cell, count = zip(*self._pending)
            self.image = np.concatenate([self.image, *image])
            self.cell = np.concatenate([self.cell, *cell])
            self.count = np.concatenate([self.count, *count])
            self._pending = []

    def cells(self) -> np.ndarray:
        """The stored cells as one int64 array ``[nnz, 3]`` of (image, cell, pixels) rows: what the ranks
        send one another (``locatdino.evaluation.metric.gather_confusions``)."""
        self._merge()
        return np.stack([self.image, self.cell, self.count], axis=1)

    def dense(self) -> np.ndarray:
        """All matrices ``[N, C, C]`` (small data and tests: ADE20K's would be 360 MB)."""
        self._merge()
        c = self.num_classes
        out = np.zeros((self.num_images, c * c), np.int64)
        out[self.image, self.cell] = self.count
        return out.reshape(-1, c, c)

    def sparse(self) -> csr_matrix:
        """All matrices as one sparse ``[N, C·C]`` float64 matrix (row: image, column: target · C +
        prediction): sums over weighted images are one product, whatever the number of classes."""
        self._merge()
        c = self.num_classes
        return csr_matrix((self.count.astype(np.float64), (self.image, self.cell)), shape=(self.num_images, c * c))

    def class_counts(self) -> np.ndarray:
        """Per image and class, what IoU needs: ``[N, 3, C]`` true positives, ground-truth pixels
        and predicted pixels (the diagonal, row sums and column sums of each matrix)."""
        self._merge()
        c, n = self.num_classes, self.num_images
        target, pred = np.divmod(self.cell, c)
        counts = np.zeros((n, 3, c), np.int64)
        diagonal = target == pred
        np.add.at(counts, (self.image[diagonal], 0, target[diagonal]), self.count[diagonal])
        np.add.at(counts, (self.image, 1, target), self.count)
        np.add.at(counts, (self.image, 2, pred), self.count)
        return counts

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically as a compressed ``.npz``."""
        self._merge()
        return atomic_write(
            path,
            lambda f: np.savez_compressed(
                f,
                num_classes=self.num_classes,
                class_mask=self.class_mask,
                num_images=self.num_images,
                image=self.image,
                cell=self.cell,
                count=self.count,
            ),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> ImageConfusions:
        """Read a file :meth:`save` wrote; ``ValueError`` naming the file and what is wrong when it
        is not one (a FIFO, a device, a file or arrays larger than :data:`MAX_BYTES`), or holds
        cells outside its own images and classes."""
        content = io.BytesIO(read_bounded(path, MAX_BYTES, "per-image confusion file"))
        if not zipfile.is_zipfile(content):  # np.load would try a pickle and say "pickled data"
            raise ValueError(f"{path}: not a per-image confusion file (not an .npz archive)")
        try:  # is_zipfile reads only the end record: the directory it points at may still be broken
            with zipfile.ZipFile(content) as archive:
                unpacked = sum(member.file_size for member in archive.infolist())
        except zipfile.BadZipFile as err:
            raise ValueError(f"{path}: not a per-image confusion file ({first_line(err)})") from None
        if unpacked > MAX_BYTES:  # compressed zeros: a few kB that unpack to gigabytes
            raise ValueError(
                f"{path}: its arrays unpack to {unpacked / 2**20:.0f} MiB, more than a per-image "
                f"confusion file ever holds ({MAX_BYTES / 2**20:.0f} MiB)"
            )
        try:
            with np.load(content) as arrays:
                loaded = cls(
                    int(arrays["num_classes"]),
                    arrays["class_mask"].astype(bool),
                    int(arrays["num_images"]),
                    arrays["image"].astype(np.int64),
                    arrays["cell"].astype(np.int64),
                    arrays["count"].astype(np.int64),
                )
        except (OSError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as err:
            raise ValueError(f"{path}: not a per-image confusion file ({first_line(err)})") from None
        problem = loaded.inconsistency()
        if problem:
            raise ValueError(f"{path}: damaged per-image confusion file ({problem})")
        return loaded

    def inconsistency(self) -> str | None:
        """What makes the stored cells impossible (None when they are consistent)."""
        self._merge()
        c, n = self.num_classes, self.num_images
        if c < 1 or n < 0 or self.class_mask.shape != (c,):
            return f"{c} classes, {n} images, class mask of shape {self.class_mask.shape}"
        if not len(self.image) == len(self.cell) == len(self.count):
            return f"cell arrays of lengths {len(self.image)}, {len(self.cell)}, {len(self.count)}"
        for name, values, high in (("image", self.image, n), ("cell", self.cell, c * c)):
            bad = (values < 0) | (values >= high)
            if bad.any():
                return f"{name} index {values[bad][0]} outside [0, {high})"
        if (self.count < 0).any():
            return "negative pixel count"
        return None
