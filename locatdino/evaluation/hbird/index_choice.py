"""The ``auto`` k-NN index: exact search while it is cheap, IVF once it is not, and the recall
of the approximate index measured against exact search on a sample of real query patches.

Exact search costs ``memory × queries`` inner products: negligible for small memories, but it
grows linearly with them: 19 s for 0.8M memory patches against 9,800 query patches on a 2-core
CPU, where IVF searched in 3.8 s after 21 s of building (benchmarks/RESULTS.md, "How does
Hummingbird scale with the memory?"). An ``IVF{nlist},Flat`` index with ``nlist ≈ 4√M`` cells and
``nprobe`` 64 scans ~2–5 % of the memory per query and keeps the vectors uncompressed, so the
scores it returns are exact and only a neighbour it misses can change a prediction. The recall
says how often that happens; it is reported with every result that used an approximate index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AUTO = "auto"
# Below either bound exact search takes a few seconds on 2 cores, about what IVF's k-means costs.
AUTO_MIN_MEMORY = 65_536
AUTO_MIN_PAIRS = 1_000_000_000  # memory patches × query patches (~6 s of exact search on 2 cores)
AUTO_NPROBE = 64
RECALL_SAMPLE = 2048  # query patches compared with exact search


@dataclass(frozen=True)
class IndexChoice:
    spec: str
    nprobe: int | None


def auto_index(memory_patches: int, query_patches: int, nprobe: int | None = None) -> IndexChoice:
    """``Flat`` for a small search (memory below ``AUTO_MIN_MEMORY`` patches or fewer than
    ``AUTO_MIN_PAIRS`` query–memory pairs), else ``IVF{nlist},Flat`` with ``nlist`` = 4√M
    rounded down to a multiple of 64 and ``nprobe`` (default ``AUTO_NPROBE``)."""
    if memory_patches < AUTO_MIN_MEMORY or memory_patches * query_patches < AUTO_MIN_PAIRS:
        return IndexChoice("Flat", None)
    return IndexChoice(f"IVF{ivf_cells(memory_patches)},Flat", nprobe or AUTO_NPROBE)


def ivf_cells(memory_patches: int, per_sqrt: float = 4.0) -> int:
    """IVF cells for a memory of M patches: ``per_sqrt``·√M rounded down to a multiple of 64
    (at least 64), the usual FAISS guideline of a few √M cells."""
    return max(64, int(per_sqrt * np.sqrt(memory_patches)) // 64 * 64)


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k neighbours that the index returned."""
    k = exact.shape[1]
    return float(np.mean([np.intersect1d(f, e).size / k for f, e in zip(found, exact)]))


def sample_rows(n: int, size: int = RECALL_SAMPLE, seed: int = 0) -> np.ndarray:
    """Sorted row indices of a fixed random sample of at most ``size`` of ``n`` rows."""
    return np.sort(np.random.default_rng(seed).choice(n, size=min(n, size), replace=False))
