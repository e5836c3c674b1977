"""Recall@k of the torch exact k-NN (half-precision coarse pass) against float32 brute force on
clustered memories, the near-duplicate patches a real patch memory is made of.

    python -m benchmarks.speed.torch_knn_recall            # 40k x 384 memory, 200 queries, k = 30

Memories: 100 cluster centres, each point at cosine ≈ ``c`` to its centre (c = 0.99, 0.996, 0.999)
and an isotropic one. Recall counts an id as found when FAISS ``IndexFlatIP`` returns it or when
its float64 score ties the reference's k-th score within 1e-6 (ties at float32 resolution);
"half-precision top-k" is the coarse pass alone, what a search without re-ranking would return.
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np
import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.evaluation.torch_knn import TorchExactSearch


def clustered(n: int, d: int, clusters: int, cosine: float | None, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    if cosine is None:
        return torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1).numpy()
    centres = torch.nn.functional.normalize(torch.randn(clusters, d, generator=g), dim=1)
    sigma = ((1 / cosine**2 - 1) / d) ** 0.5  # ‖noise‖² ≈ d σ²: cosine to the centre ≈ ``cosine``
    x = centres[torch.randint(clusters, (n,), generator=g)] + sigma * torch.randn(n, d, generator=g)
    return torch.nn.functional.normalize(x, dim=1).numpy()


def recall(ids: np.ndarray, ref_ids: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Share of found neighbours, ties with the reference's k-th score counted as found."""
    hits = 0
    for row, (got, want) in enumerate(zip(ids, ref_ids)):
        kth = exact[row, want].min()
        hits += sum(i in set(want) or exact[row, i] >= kth - 1e-6 for i in got)
    return hits / (len(ids) * k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", type=int, default=40_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=30)
    add_results_option(parser, "torch_knn_recall.json")
    args = parser.parse_args()
    args.results = results_file(args, "torch_knn_recall.json")  # before any measuring
    print("| memory | coarse pass | recall@k | half-precision top-k alone | search s |")
    print("| --- | --- | --- | --- | --- |")
    rows = []
    for cosine in (None, 0.99, 0.996, 0.999):
        data = clustered(args.memory + args.queries, args.dim, 100, cosine, 0)
        memory, queries = data[: args.memory], data[args.memory :]
        index = faiss.IndexFlatIP(args.dim)
        index.add(memory)
        ref_ids = index.search(queries, args.k)[1]
        exact = queries.astype(np.float64) @ memory.astype(np.float64).T
        for dtype in (torch.float16, torch.bfloat16):
            start = time.perf_counter()
            ids = TorchExactSearch(memory, "cpu", dtype).search(queries, args.k)[1]
            took = time.perf_counter() - start
            half = (torch.from_numpy(queries).to(dtype) @ torch.from_numpy(memory).to(dtype).T).float()
            label = "isotropic" if cosine is None else f"clusters, cosine ≈ {cosine}"
            rows.append(
                {
                    "memory": label,
                    "coarse_dtype": str(dtype).removeprefix("torch."),
                    "recall": recall(ids, ref_ids, exact, args.k),
                    "coarse_topk_recall": recall(half.topk(args.k).indices.numpy(), ref_ids, exact, args.k),
                    "search_s": took,
                }
            )
            r = rows[-1]
            print(
                f"| {label} | {r['coarse_dtype']} | {r['recall']:.4f} | {r['coarse_topk_recall']:.3f} | {took:.2f} |",
                flush=True,
            )
    write_results(args.results, "torch_knn_recall.json", {"k": args.k, "rows": rows})


if __name__ == "__main__":
    main()
