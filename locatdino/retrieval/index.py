"""k-NN search over the patch memory with FAISS (SPEC §3).

Cosine similarity = inner product of L2-normalised vectors, so every index uses
``METRIC_INNER_PRODUCT``. ``"Flat"`` (``IndexFlatIP``, exact, BLAS-blocked) is the default; any
FAISS factory string selects an approximate index for large memories: ``"IVF4096,Flat"``,
``"IVF4096,PQ48"``, ``"HNSW32"``, with ``nprobe`` / ``efSearch``. A GPU copy of the index is used
when faiss-gpu and a GPU are present (``device="auto"``); the CPU path is always available.

Exact search on the CPU over a float32 memory builds no index at all: ``faiss.knn`` runs the same
blocked-BLAS inner-product search as ``IndexFlatIP`` straight on the memory array, so the memory
is held once (an ``IndexFlatIP`` would keep a second copy).
"""

from __future__ import annotations

import re
import warnings

import faiss
import numpy as np

_LOSSY = re.compile(r"PQ|SQ|LSH|RaBitQ|Residual|RQ|LSQ")


def faiss_gpu_available() -> bool:
    """Whether this FAISS build has GPU support and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class PatchIndex:
    """A FAISS inner-product index built from a ``[N, D]`` feature array.

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
    ):
        try:
            self.index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as err:
            msg = str(err).strip().splitlines()[-1]
            raise ValueError(f"invalid FAISS index spec {spec!r}: {msg}") from None
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"index device must be 'auto', 'cpu' or 'gpu', got {device!r}")
        if device == "gpu" and not faiss_gpu_available():
            raise ValueError("index device 'gpu' requested but FAISS sees no GPU (faiss-cpu build?)")
        self.dim, self.spec = dim, spec
        self.params = {k: v for k, v in (("nprobe", nprobe), ("efSearch", ef_search)) if v is not None}
        self.device, self.train_size, self.seed = device, train_size, seed
        self.on_gpu = False
        self._memory: np.ndarray | None = None  # searched in place with faiss.knn (exact, CPU)

    @property
    def exact_scores(self) -> bool:
        """True when the returned similarities are exact inner products (vectors stored
        uncompressed: Flat, IVF…,Flat, HNSW); False for PQ/SQ codes."""
        return not _LOSSY.search(self.spec)

    @property
    def ntotal(self) -> int:
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
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self._memory is not None:
            return faiss.knn(queries, self._memory, k, metric=faiss.METRIC_INNER_PRODUCT)
        return self.index.search(queries, k)
