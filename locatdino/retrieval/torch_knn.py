"""Exact inner-product k-NN with torch (matmul + top-k over memory chunks), for GPUs without faiss-gpu.

Why: faiss-gpu is not installable from the package index, and an encoder on CUDA would otherwise
hand every query batch to FAISS on the CPU. The whole memory is copied once to the device in its
stored dtype (float32 or float16: the values FAISS searches, so scores agree), then per chunk of
queries:

1. coarse pass: over chunks of the memory, ``scores = queries @ chunkᵀ`` in ``search_dtype``
   (float16 on CUDA: tensor-core speed; the memory chunk is cast on the fly when stored in
   float32) and a running top-``candidates`` merged chunk by chunk, so no ``[n, N]`` score matrix
   is ever held;
2. re-check: the candidates' similarities recomputed in float32 from the stored features and
   the top-``k`` taken from those. A half-precision coarse pass keeps ``2k`` candidates, so a
   true neighbour is lost only if rounding (≈1e-3 on a cosine) pushes it below ``k`` others.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

_STORED = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}


class TorchExactSearch:
    """Exact cosine / inner-product search over ``features [N, D]`` on ``device``.

    Args:
        features: the memory, float32 or float16 (a NumPy array or memory map; on the CPU a
            contiguous one is searched in place, read-only memory maps included, so a saved
            10M-patch bank is never copied; otherwise copied to ``device`` chunk by chunk).
        device: where the memory lives and the search runs.
        search_dtype: precision of the coarse pass; default float16 on CUDA, float32 elsewhere
            (float32: the coarse pass is already exact and keeps ``k`` candidates).
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
        if features.ndim != 2 or features.dtype not in _STORED:
            raise ValueError(f"torch k-NN expects float32/float16 features [N, D], got "
                             f"{features.dtype} {tuple(features.shape)}")
        self.device = torch.device(device)
        self.search_dtype = search_dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self.query_chunk, self.memory_chunk = query_chunk, memory_chunk
        self.memory = self._upload(features)

    def _upload(self, features: np.ndarray) -> torch.Tensor:
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
        if not 1 <= k <= self.ntotal:
            raise ValueError(f"k={k} neighbours requested but the memory holds {self.ntotal} patches")
        queries = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)
        exact_pass = self.search_dtype == torch.float32
        candidates = min(self.ntotal, k if exact_pass else 2 * k)
        sims, ids = [], []
        for start in range(0, queries.shape[0], self.query_chunk):
            block = queries[start : start + self.query_chunk]
            cand = self._coarse(block, candidates)
            exact = torch.einsum("nd,nkd->nk", block, self.memory[cand].float())
            top, order = exact.topk(k, dim=1)
            sims.append(top.cpu())
            ids.append(cand.gather(1, order).cpu())
        return torch.cat(sims).numpy(), torch.cat(ids).numpy()

    def _coarse(self, queries: torch.Tensor, candidates: int) -> torch.Tensor:
        """Ids ``[n, candidates]`` of the best coarse scores, merged over memory chunks."""
        q = queries.to(self.search_dtype)
        best_scores = best_ids = None
        for start in range(0, self.ntotal, self.memory_chunk):
            chunk = self.memory[start : start + self.memory_chunk].to(self.search_dtype)
            scores, ids = (q @ chunk.T).topk(min(candidates, chunk.shape[0]), dim=1)
            ids += start
            if best_scores is not None:
                scores, ids = torch.cat([best_scores, scores], 1), torch.cat([best_ids, ids], 1)
                scores, pick = scores.topk(min(candidates, scores.shape[1]), dim=1)
                ids = ids.gather(1, pick)
            best_scores, best_ids = scores, ids
        return best_ids
