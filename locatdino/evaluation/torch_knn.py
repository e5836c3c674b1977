"""Exact inner-product k-NN with torch (matmul + top-k over memory chunks), for GPUs without faiss-gpu.

Why: faiss-gpu is not installable from the package index, and an encoder on CUDA would otherwise
hand every query batch to FAISS on the CPU. The whole memory is copied once to the device in its
stored dtype (float32 or float16: the values FAISS searches, so scores agree), then per chunk of
queries:

1. coarse pass: over chunks of the memory, ``scores = queries @ chunkᵀ`` in ``search_dtype``
   (float16 on CUDA: tensor-core speed; the memory chunk is cast on the fly when stored in
   float32) and a running top-``width`` merged chunk by chunk, so no ``[n, N]`` score matrix
   is ever held;
2. re-rank: the candidates' similarities recomputed in float32 from the stored features and
   the top-``k`` taken from those.

The result is the float32 brute-force result (up to ties at float32 resolution), not an
approximation of it. A half-precision score is off by at most ``δ = (3u + u² + D·2⁻²³)·‖q‖·M``
(u the unit roundoff of ``search_dtype``: operands and result rounded once each, float32
accumulation of D products; M the largest memory norm), so every true neighbour scores at least
``s_k − 2δ`` in the coarse pass (``s_k`` the k-th coarse score). A query's candidate list is
complete when its last candidate scores below that threshold; queries whose list is not (dense
memories: near-duplicate patches of one region score within ``2δ ≈ 3e-3`` of each other in
float16) are searched again with 8 times the width, and past ``_MAX_WIDTH`` candidates by a
float32 pass over the whole memory. On isotropic data one ``2k``-wide pass settles every query.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import numpy as np
import torch

_STORED = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}
_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # unit roundoff of the coarse pass
_MAX_WIDTH = 4096  # candidates per query beyond which a float32 pass is cheaper than re-ranking
_RERANK_ELEMENTS = 2**24  # gathered candidate features per re-rank block (64 MiB in float32)


class TorchExactSearch:
    """Exact cosine / inner-product search over ``features [N, D]`` on ``device``.

    Args:
        features: the memory, float32 or float16: a NumPy array or memory map (on the CPU a
            contiguous one is searched in place, read-only memory maps included, so a saved
            10M-patch bank is never copied; otherwise copied to ``device`` chunk by chunk), or a
            torch tensor (used in place when already on ``device``).
        device: where the memory lives and the search runs.
        search_dtype: precision of the coarse pass: float16 / bfloat16 (default float16 on
            CUDA) or float32 (default elsewhere: the coarse pass is already exact and keeps
            ``k`` candidates).
        query_chunk, memory_chunk: rows of each score block ``[query_chunk, memory_chunk]``.
    """

    def __init__(
        self,
        features: np.ndarray,
        device: torch.device | str = "cpu",
        search_dtype: torch.dtype | None = None,
        query_chunk: int = 4096,
        memory_chunk: int = 32768,
    ):
        if features.ndim != 2 or features.dtype not in (*_STORED, *_STORED.values()):
            raise ValueError(
                f"torch k-NN expects float32/float16 features [N, D], got {features.dtype} {tuple(features.shape)}"
            )
        self.device = torch.device(device)
        self.search_dtype = search_dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        if self.search_dtype not in (torch.float32, *_ROUNDOFF):
            raise ValueError(f"torch k-NN search_dtype must be float32, float16 or bfloat16, got {self.search_dtype}")
        self.query_chunk, self.memory_chunk = query_chunk, memory_chunk
        self.memory = self._upload(features)
        self._max_norm: float | None = None  # largest memory norm, measured at the first half-precision search

    def _upload(self, features: np.ndarray | torch.Tensor) -> torch.Tensor:
        if isinstance(features, torch.Tensor):
            return features.to(self.device)
        if self.device.type == "cpu" and features.flags.c_contiguous:
            with warnings.catch_warnings():  # read-only arrays: the search never writes to them
                warnings.filterwarnings("ignore", message=".*not writable.*")
                return torch.from_numpy(features)
        memory = torch.empty(features.shape, dtype=_STORED[features.dtype], device=self.device)
        for start in range(0, features.shape[0], self.memory_chunk):
            rows = np.array(features[start : start + self.memory_chunk])  # own, writable copy of a memmap slice
            memory[start : start + rows.shape[0]].copy_(torch.from_numpy(rows), non_blocking=False)
        return memory

    @property
    def ntotal(self) -> int:
        return self.memory.shape[0]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``sims [n, k]`` float32 inner products (descending) and ``ids [n, k]`` int64 of the
        ``k`` nearest memory rows of ``queries [n, D]``, as FAISS ``IndexFlatIP.search``."""
        queries = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        sims, ids = zip(*((top.cpu(), found.cpu()) for top, found in self.search_blocks(queries, k)))
        return torch.cat(sims).numpy(), torch.cat(ids).numpy()

    def search_blocks(self, queries: torch.Tensor, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`search` as tensors on the search's device, one ``(sims, ids)`` pair per chunk of
        ``query_chunk`` queries, in order: a caller that reduces each chunk (a vote, a label)
        never holds the ``[n, k]`` result of all queries."""
        if not 1 <= k <= self.ntotal:
            raise ValueError(f"k={k} neighbours requested but the memory holds {self.ntotal} patches")
        for start in range(0, queries.shape[0], self.query_chunk):
            yield self._search_block(queries[start : start + self.query_chunk].to(self.device, torch.float32), k)

    def _search_block(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 top-``k`` of ``queries``: coarse passes of growing width until each query's
        candidate list provably holds its ``k`` nearest (see the module docstring)."""
        if self.search_dtype == torch.float32:
            return self._rerank(queries, self._coarse(queries, k, torch.float32)[1], k)
        sims = torch.empty(queries.shape[0], k, device=self.device)
        ids = torch.empty(queries.shape[0], k, dtype=torch.int64, device=self.device)
        margin = 2 * self._score_error() * queries.norm(dim=1)
        todo, width = torch.arange(queries.shape[0], device=self.device), 2 * k
        while todo.numel():
            if width >= self.ntotal or width > _MAX_WIDTH:  # the float32 pass is exact
                sims[todo], ids[todo] = self._rerank(queries[todo], self._coarse(queries[todo], k, torch.float32)[1], k)
                break
            scores, cand = self._coarse(queries[todo], width, self.search_dtype)
            complete = scores[:, -1].float() < scores[:, k - 1].float() - margin[todo]
            done = todo[complete]
            sims[done], ids[done] = self._rerank(queries[done], cand[complete], k)
            todo, width = todo[~complete], 8 * width
        return sims, ids

    def _score_error(self) -> float:
        """Bound on ``|coarse score − exact score| / ‖q‖`` (the module docstring's ``δ / ‖q‖``)."""
        if self._max_norm is None:
            self._max_norm = max(
                self.memory[start : start + self.memory_chunk].float().norm(dim=1).max().item()
                for start in range(0, self.ntotal, self.memory_chunk)
            )
        u = _ROUNDOFF[self.search_dtype]
        return (3 * u + u * u + self.memory.shape[1] * 2.0**-23) * self._max_norm

    def _rerank(self, queries: torch.Tensor, cand: torch.Tensor, k: int) -> torch.Tensor:
        """Float32 scores of the candidates ``cand [n, width]``, top ``k``: ``(sims, ids)``."""
        rows = max(1, _RERANK_ELEMENTS // (cand.shape[1] * self.memory.shape[1]))
        sims, ids = [], []
        for start in range(0, cand.shape[0], rows):
            block = cand[start : start + rows]
            exact = torch.einsum("nd,nkd->nk", queries[start : start + rows], self.memory[block].float())
            top, order = exact.topk(k, dim=1)
            sims.append(top)
            ids.append(block.gather(1, order))
        if not sims:
            return cand.new_empty(0, k, dtype=torch.float32), cand.new_empty(0, k)
        return torch.cat(sims), torch.cat(ids)

    def _coarse(self, queries: torch.Tensor, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Best ``width`` scores in ``dtype`` (descending) and their ids, both ``[n, width]``,
        merged over memory chunks."""
        q = queries.to(dtype)
        best_scores = best_ids = None
        with _float32_accumulation():
            for start in range(0, self.ntotal, self.memory_chunk):
                chunk = self.memory[start : start + self.memory_chunk].to(dtype)
                scores, ids = (q @ chunk.T).topk(min(width, chunk.shape[0]), dim=1)
                ids += start
                if best_scores is not None:
                    scores, ids = torch.cat([best_scores, scores], 1), torch.cat([best_ids, ids], 1)
                    scores, pick = scores.topk(min(width, scores.shape[1]), dim=1)
                    ids = ids.gather(1, pick)
                best_scores, best_ids = scores, ids
        return best_scores, best_ids


@contextlib.contextmanager
def _float32_accumulation() -> Iterator[None]:
    """cuBLAS may otherwise sum half-precision products in half precision (split-K), which the
    error bound ``δ`` does not cover."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_fp16_reduced_precision_reduction = matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = saved
