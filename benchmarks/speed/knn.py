"""Time and peak memory of DINO's k-NN classifier (``locatdino knn``) on ImageNet-sized features.

    python -m benchmarks.speed.knn                  # 100k x 384 train, 10k queries, k = 10 20 100 200

Each search runs :func:`~locatdino.evaluation.knn_classifier.knn_classify` end to end (normalisation, neighbour
search at the largest k, votes of every k) in a fresh process, once to load every kernel and once
measured, so its peak memory is its own: Linux's peak resident size (``VmHWM``), reset just before
the second search, minus the resident size then (the features themselves). Searches: ``torch``
(exact, ``1024 × 16384`` blocks with a running top-k), ``faiss`` (``IndexFlatIP``), and the
reference's own loop for scale (facebookresearch/dino ``knn_classifier``: the queries in 100 chunks,
each against every train feature at once). Features: 1,000 clusters (classes) on the unit sphere,
each point at cosine ≈ 0.5 to its centre. Ratios are of this run; the rankings of all searches are
compared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.evaluation.knn_classifier import knn_classify

KS = (10, 20, 100, 200)
SEARCHES = ("torch", "faiss", "reference")


def features(n_train: int, n_test: int, dim: int, classes: int, seed: int = 0):
    """Train / test features and labels: ``classes`` clusters, points at cosine ≈ 0.5 to their centre."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(classes, dim, generator=g), dim=1)
    labels = torch.randint(classes, (n_train + n_test,), generator=g)
    x = centres[labels] + (3 / dim) ** 0.5 * torch.randn(n_train + n_test, dim, generator=g)  # ‖noise‖² ≈ 3
    return x[:n_train], labels[:n_train], x[n_train:], labels[n_train:]


def reference(
    train: torch.Tensor, train_labels: torch.Tensor, test: torch.Tensor, classes: int
) -> dict[int, torch.Tensor]:
    """The reference's loop: 100 chunks of queries, each ``[M / 100, N]`` similarities at once."""
    train = torch.nn.functional.normalize(train, dim=1)
    test = torch.nn.functional.normalize(test, dim=1)
    out: dict[int, list[torch.Tensor]] = {k: [] for k in KS}
    step = max(1, len(test) // 100)
    for start in range(0, len(test), step):
        sims, ids = (test[start : start + step] @ train.T).topk(max(KS), dim=1)
        for k in KS:
            votes = torch.zeros(len(ids), classes).scatter_add_(1, train_labels[ids[:, :k]], (sims[:, :k] / 0.07).exp())
            out[k].append(votes.sort(dim=1, descending=True, stable=True).indices[:, :5])
    return {k: torch.cat(v) for k, v in out.items()}


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in bytes (``VmRSS``, ``VmHWM``)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def measure(search: str, args: argparse.Namespace) -> dict:
    """One search in this process: seconds, peak memory above the features, the rankings' file."""
    train, train_labels, test, _ = features(args.train, args.queries, args.dim, args.classes)

    def run(rows: int, queries: int) -> dict[int, torch.Tensor]:
        if search == "reference":
            return reference(train[:rows], train_labels[:rows], test[:queries], args.classes)
        return knn_classify(
            train[:rows],
            train_labels[:rows],
            test[:queries],
            KS,
            num_classes=args.classes,
            backend=search,
            memory_chunk=args.memory_chunk,
        )

    run(len(train), len(test))  # once untimed: the pages of the libraries' kernels are not the search's memory
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    before = _status("VmRSS")
    start = time.perf_counter()
    rankings = run(len(train), len(test))
    seconds = time.perf_counter() - start
    peak = _status("VmHWM") - before
    np.savez(args.rankings, **{str(k): v.numpy() for k, v in rankings.items()})
    return {"search": search, "seconds": seconds, "peak_extra_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--memory-chunk", type=int, default=16384, help="train rows per block of the torch search")
    parser.add_argument("--only", choices=SEARCHES, default=None, help=argparse.SUPPRESS)  # one search, in a child
    parser.add_argument("--rankings", default=None, help=argparse.SUPPRESS)
    add_results_option(parser, "knn.json")
    args = parser.parse_args()
    if args.only:
        print(json.dumps(measure(args.only, args)))
        return
    results = results_file(args, "knn.json")  # before any measuring
    sizes = [
        "--train",
        str(args.train),
        "--queries",
        str(args.queries),
        "--dim",
        str(args.dim),
        "--classes",
        str(args.classes),
        "--memory-chunk",
        str(args.memory_chunk),
    ]
    rows, rankings = [], {}
    for search in SEARCHES:
        path = Path(f"/tmp/knn-bench-{search}.npz")
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.speed.knn", *sizes, "--only", search, "--rankings", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode:
            raise SystemExit(f"{search} search failed:\n{child.stderr}")
        rows.append(json.loads(child.stdout.splitlines()[-1]))
        with np.load(path) as saved:
            rankings[search] = {k: saved[k] for k in saved.files}
        path.unlink()
    torch_row = rows[0]
    print("| search | seconds | peak memory above the features (MB) | time / torch | top-1 agreement with torch |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        row["time_ratio_to_torch"] = row["seconds"] / torch_row["seconds"]
        row["top1_agreement"] = {
            k: float(np.mean(rankings[row["search"]][k][:, 0] == rankings["torch"][k][:, 0])) for k in rankings["torch"]
        }
        print(
            f"| {row['search']} | {row['seconds']:.1f} | {row['peak_extra_mb']:.0f} | "
            f"{row['time_ratio_to_torch']:.2f} | {min(row['top1_agreement'].values()):.4f} |"
        )
    write_results(
        results,
        "knn.json",
        {
            "train": args.train,
            "queries": args.queries,
            "dim": args.dim,
            "classes": args.classes,
            "ks": list(KS),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
