"""k-NN search over the patch memory with FAISS (docs/evaluation.md).

Cosine similarity = inner product of L2-normalised vectors, so every index uses
``METRIC_INNER_PRODUCT``. ``"Flat"`` (``IndexFlatIP``, exact, BLAS-blocked) is the default; any
FAISS factory string selects an approximate index for large memories: ``"IVF4096,Flat"``,
``"IVF4096,PQ48"``, ``"HNSW32"``, with ``nprobe`` / ``efSearch``. A GPU copy of the index is used
when faiss-gpu and a GPU are present (``device="auto"``); the CPU path is always available.

Exact search on the CPU over a float32 memory builds no index at all: ``faiss.knn`` runs the same
blocked-BLAS inner-product search as ``IndexFlatIP`` straight on the memory array, so the memory
is held once (an ``IndexFlatIP`` would keep a second copy).

Exact search next to an encoder on CUDA without faiss-gpu (not on the package index) runs on that
GPU with torch instead (:class:`~locatdino.evaluation.torch_knn.TorchExactSearch`, same
neighbours): ``backend="auto"`` picks it; ``"torch"`` / ``"faiss"`` force one.
"""

from __future__ import annotations

import re
import warnings

import faiss
import numpy as np
import torch

from locatdino.evaluation.torch_knn import TorchExactSearch

_LOSSY = re.compile(r"PQ|SQ|LSH|RaBitQ|Residual|RQ|LSQ")
BACKENDS = ("auto", "faiss", "torch")


def faiss_gpu_available() -> bool:
    """Whether this FAISS build has GPU support and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def check_index_device(device: str, spec: str, backend: str = "auto") -> None:
    """``ValueError`` before any work when index device ``"gpu"`` cannot be had: a FAISS build
    without GPU support leaves only exact search (``Flat``, or ``auto``, which then picks it)
    with the torch backend on a CUDA device; otherwise it would fail once the memory is built."""
    if device != "gpu" or faiss_gpu_available():
        return
    if spec not in ("Flat", "auto") or backend == "faiss":
        raise ValueError(
            f"--index-device gpu: this FAISS has no GPU support (faiss-cpu build), and without it only "
            f"exact search runs on a GPU (--index Flat, not {spec!r}; --knn-backend auto or torch, "
            f"not {backend!r}): use --index-device cpu or install faiss-gpu"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            "--index-device gpu: neither FAISS (a faiss-cpu build) nor torch sees a GPU here: use "
            "--index-device auto or cpu"
        )


class PatchIndex:
    """An inner-product k-NN index built from a ``[N, D]`` feature array (FAISS, or torch exact
    search on a GPU that FAISS cannot use).

    Args:
        dim: feature dimension ``D``.
        spec: FAISS ``index_factory`` string; ``"Flat"`` = exact ``IndexFlatIP``.
        nprobe: IVF cells visited per query (IVF indices only).
        ef_search: HNSW candidate-list size (HNSW indices only).
        device: ``"auto"`` (GPU when faiss-gpu sees one), ``"cpu"`` or ``"gpu"``.
        train_size: vectors sampled from the memory to train IVF/PQ quantisers; default
            ``max(65536, 40 * nlist)`` — FAISS asks for >= 39 per IVF cell, and k-means time grows
            with the sample (training on all 177k patches took 10 s of a 47 s run).
        seed: seed of that sample.
        backend: ``"auto"`` (torch exact search on ``torch_device`` for a ``Flat`` spec when it
            is a GPU and FAISS sees none, else FAISS), ``"faiss"`` or ``"torch"`` (``Flat`` only).
        torch_device: where the encoder runs: the torch backend's device (``"torch"`` without
            it: CUDA when available; ``device="cpu"`` keeps it on the CPU).
    """

    def __init__(
        self,
        dim: int,
        spec: str = "Flat",
        nprobe: int | None = None,
        ef_search: int | None = None,
        device: str = "auto",
        train_size: int | None = None,
        seed: int = 0,
        backend: str = "auto",
        torch_device: torch.device | str | None = None,
    ):
        try:
            self.index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as err:
            msg = str(err).strip().splitlines()[-1]
            raise ValueError(f"invalid FAISS index spec {spec!r}: {msg}") from None
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"index device must be 'auto', 'cpu' or 'gpu', got {device!r}")
        self.dim, self.spec = dim, spec
        self.params = {k: v for k, v in (("nprobe", nprobe), ("efSearch", ef_search)) if v is not None}
        self.device, self.train_size, self.seed = device, train_size, seed
        self.torch_device = self._torch_device(backend, torch_device)
        if device == "gpu" and not faiss_gpu_available() and self.torch_device is None:
            raise ValueError("index device 'gpu' requested but FAISS sees no GPU (faiss-cpu build?)")
        self.on_gpu = False
        self._memory: np.ndarray | None = None  # searched in place with faiss.knn (exact, CPU)
        self._torch: TorchExactSearch | None = None

    def _torch_device(self, backend: str, encoder_device: torch.device | str | None) -> torch.device | None:
        """The torch backend's device, or None for FAISS."""
        if backend not in BACKENDS:
            raise ValueError(f"k-NN backend must be one of {BACKENDS}, got {backend!r}")
        exact = isinstance(self.index, faiss.IndexFlat)
        encoder = torch.device(encoder_device) if encoder_device is not None else None
        if backend == "torch":
            if not exact:
                raise ValueError(f"the torch k-NN backend is exact search only (index 'Flat'), got {self.spec!r}")
            if self.device == "cpu":
                return torch.device("cpu")
            return encoder or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # auto: only where FAISS would search on the CPU while a GPU is in use
        if backend == "faiss" or not exact or self.device == "cpu" or faiss_gpu_available():
            return None
        if encoder is not None and encoder.type == "cuda":
            return encoder
        return torch.device("cuda") if self.device == "gpu" and torch.cuda.is_available() else None

    @property
    def exact_scores(self) -> bool:
        """True when the returned similarities are exact inner products (vectors stored
        uncompressed: Flat, IVF…,Flat, HNSW); False for PQ/SQ codes."""
        return not _LOSSY.search(self.spec)

    @property
    def ntotal(self) -> int:
        if self._torch is not None:
            return self._torch.ntotal
        return self.index.ntotal if self._memory is None else self._memory.shape[0]

    def build(self, features: np.ndarray, chunk: int = 65_536) -> PatchIndex:
        """Index ``features [N, D]``, then :meth:`finish`.

        Exact search on the CPU over a contiguous float32 array keeps a reference to it (no copy;
        the caller must not modify it while searching). Otherwise: train (if the index needs it)
        on a random sample and add the features in chunks, so a memory-mapped float16 memory is
        never copied whole into float32.
        """
        n = features.shape[0]
        if features.ndim != 2 or features.shape[1] != self.dim:
            raise ValueError(f"index expects features [N, {self.dim}], got {tuple(features.shape)}")
        if self.torch_device is not None:
            self._torch = TorchExactSearch(features, self.torch_device)
            self.on_gpu = self.torch_device.type == "cuda"
            return self
        searched_in_place = isinstance(self.index, faiss.IndexFlat) and (
            self.device == "cpu" or not faiss_gpu_available()
        )
        if searched_in_place and features.dtype == np.float32 and features.flags.c_contiguous:
            self._memory = features
            return self.finish()
        if not self.index.is_trained:
            rng = np.random.default_rng(self.seed)
            sample = np.sort(rng.choice(n, size=min(n, self._train_size()), replace=False))
            self.index.train(np.ascontiguousarray(features[sample], dtype=np.float32))
        for start in range(0, n, chunk):
            self.add(features[start : start + chunk])
        return self.finish()

    def _train_size(self) -> int:
        if self.train_size is not None:
            return self.train_size
        ivf = faiss.try_extract_index_ivf(self.index)
        return max(65_536, 40 * ivf.nlist) if ivf is not None else 65_536

    def add(self, features: np.ndarray) -> None:
        """Append vectors ``[n, D]`` (the index must be trained)."""
        self.index.add(np.ascontiguousarray(features, dtype=np.float32))

    def finish(self) -> PatchIndex:
        """Set the search parameters and move to the GPU when one is available (``device``)."""
        self._apply_params(faiss.ParameterSpace())
        if self.device != "cpu" and faiss_gpu_available():
            self._to_gpu()
        return self

    def _apply_params(self, space) -> None:
        for name, value in self.params.items():
            try:
                space.set_index_parameter(self.index, name, value)
            except RuntimeError:
                raise ValueError(f"FAISS index {self.spec!r} has no parameter {name!r}") from None

    def _to_gpu(self) -> None:
        try:
            self.index = faiss.index_cpu_to_all_gpus(self.index)
        except RuntimeError as err:  # e.g. HNSW has no GPU version: stay on CPU
            if self.device == "gpu":
                raise
            warnings.warn(f"FAISS index {self.spec!r} stays on CPU: {err}", stacklevel=3)
            return
        self.on_gpu = True
        self._apply_params(faiss.GpuParameterSpace())

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``k`` nearest memory patches of ``queries [n, D]`` (L2-normalised).

        Returns:
            ``sims [n, k]`` float32 inner products (descending) and ``ids [n, k]`` int64;
            ``ids == -1`` where the index found fewer than ``k`` candidates (small ``nprobe``).
        """
        if k > self.ntotal:
            raise ValueError(f"k={k} neighbours requested but the memory holds {self.ntotal} patches")
        if self._torch is not None:
            return self._torch.search(queries, k)
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self._memory is not None:
            return faiss.knn(queries, self._memory, k, metric=faiss.METRIC_INNER_PRODUCT)
        return self.index.search(queries, k)
