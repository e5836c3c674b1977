"""DINO's weighted k-NN classifier on frozen embeddings (docs/evaluation.md).

The reference protocol (facebookresearch/dino ``eval_knn.py``): train and test embeddings
L2-normalised; for each test embedding the ``k`` most cosine-similar train embeddings, each voting
for its label with weight ``exp(sim / T)`` (T = 0.07); classes ranked by summed vote, top-1 and
top-5 read from that ranking. Several ``k`` come from one neighbour search at ``max(ks)``: the
neighbours of a smaller ``k`` are the first ``k`` of them.

Bounded memory: the reference multiplies a chunk of test embeddings with *all* train embeddings
(``[M / 100, N]`` similarities, 32 GB for ImageNet's 1.28 M train images in one go); here the
search runs over ``query_chunk × memory_chunk`` blocks with a running top-k (torch, on the
features' device: :class:`~locatdino.evaluation.torch_knn.TorchExactSearch`, exact), or in a FAISS
``IndexFlatIP`` (``backend="faiss"``, CPU, exact as well). Votes are summed per query chunk, so no
``[M, C]`` tensor of all queries is held either.

Votes are compared by their logarithm, summed per class from the class's own nearest neighbour:
``log V_c = s_c / T + log Σ_j exp((s_j − s_c) / T)`` in float64 (``s_c`` the class's highest
similarity among the ``k``). Each term lies in ``(0, 1]`` and the sum in ``[1, k]``, so no vote
overflows (the reference's ``exp(sim / T)`` is infinite in float32 once ``sim / T > 88.7``: at
``T = 0.005`` every class then ties) or underflows (a class far behind the best keeps its own
vote, which a shift by the row's best alone would round to 0 at ``T = 1e-4``): the ranking is that
of exact arithmetic on the similarities at every temperature ``2 / T`` is finite for; where the
reference does not overflow it is the reference's.

Ties: classes with equal votes are ranked by class id (smallest first), so the ranking is a
function of the features; the reference's ``sort`` leaves that order to the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from locatdino.evaluation.torch_knn import TorchExactSearch

BACKENDS = ("torch", "faiss")
RANKED = 5  # classes ranked per query: enough for top-5
# the smallest temperature whose votes are representable: |cos| / T (|cos| <= 1, 2 with rounding) finite in float64
MIN_TEMPERATURE = 2 / torch.finfo(torch.float64).max


def check_temperature(temperature: float) -> None:
    """``ValueError`` unless ``T`` is a number whose votes ``cos / T`` are finite in float64."""
    if not (temperature > 0 and math.isfinite(2 / temperature)):
        raise ValueError(
            f"temperature must be > 0 with cos / T finite in float64 (T >= {MIN_TEMPERATURE:.3g}), got {temperature}"
        )


def check_knn_settings(ks: Sequence[int], temperature: float, num_train: int) -> None:
    """``ValueError`` naming the setting when ``ks`` or ``temperature`` cannot be used with
    ``num_train`` train embeddings (before any feature is computed)."""
    if not ks or min(ks) < 1:
        raise ValueError(f"k must be at least 1, got {list(ks)}")
    if max(ks) > num_train:
        raise ValueError(
            f"k={max(ks)} neighbours asked for but the train set holds {num_train} images: use k <= {num_train}"
        )
    check_temperature(temperature)


def knn_classify(
    train_feats: Tensor,
    train_labels: Tensor,
    test_feats: Tensor,
    ks: Sequence[int] = (10, 20, 100, 200),
    temperature: float = 0.07,
    num_classes: int | None = None,
    backend: str = "torch",
    query_chunk: int = 1024,
    memory_chunk: int = 16384,
) -> dict[int, Tensor]:
    """DINO's weighted k-NN: for each ``k`` in ``ks``, ``[M, min(5, C)]`` class ids of each test
    embedding, ranked by summed vote ``exp(sim / T)`` of its ``k`` most cosine-similar train
    embeddings (classes without a vote follow, by id).

    Args:
        train_feats: ``[N, D]`` train embeddings (normalised here; any float dtype).
        train_labels: ``[N]`` integer class ids in ``[0, C)``.
        test_feats: ``[M, D]`` test embeddings.
        ks: neighbour counts, each in ``[1, N]``; one search at ``max(ks)`` serves all.
        temperature: ``T > 0`` of the vote weight.
        num_classes: ``C`` (default: largest train label + 1).
        backend: ``"torch"`` (chunked exact search on ``train_feats``' device) or ``"faiss"``
            (``IndexFlatIP`` on the CPU).
        query_chunk, memory_chunk: block sizes of the search; peak memory about
            ``query_chunk × (memory_chunk + C)`` floats beside the features.

    Returns:
        ``{k: rankings [M, min(5, C)] int64}`` on the CPU.
    """
    if train_feats.ndim != 2 or test_feats.ndim != 2 or train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(
            f"k-NN features must be [N, D] and [M, D] with one D, got {tuple(train_feats.shape)} "
            f"and {tuple(test_feats.shape)}"
        )
    if train_labels.shape != (train_feats.shape[0],):
        raise ValueError(f"{train_feats.shape[0]} train features but labels of shape {tuple(train_labels.shape)}")
    if backend not in BACKENDS:
        raise ValueError(f"k-NN backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    ks = sorted(set(ks))
    check_knn_settings(ks, temperature, train_feats.shape[0])
    num_classes = int(train_labels.max()) + 1 if num_classes is None else num_classes
    if int(train_labels.min()) < 0 or int(train_labels.max()) >= num_classes:
        raise ValueError(
            f"train labels must lie in [0, {num_classes}), got [{int(train_labels.min())}, {int(train_labels.max())}]"
        )
    train = torch.nn.functional.normalize(train_feats.float(), dim=1)
    test = torch.nn.functional.normalize(test_feats.float(), dim=1)
    ranked = min(RANKED, num_classes)
    rankings: dict[int, list[Tensor]] = {k: [] for k in ks}
    for sims, ids in _neighbours(train, test, ks[-1], backend, query_chunk, memory_chunk):
        labels = train_labels.to(ids.device)[ids]
        for k in ks:
            votes = log_votes(sims[:, :k], labels[:, :k], num_classes, temperature)
            order = torch.sort(votes, dim=1, descending=True, stable=True).indices  # ties: smallest id first
            rankings[k].append(order[:, :ranked].cpu())
    return {
        k: torch.cat(parts) if parts else torch.empty(0, ranked, dtype=torch.int64) for k, parts in rankings.items()
    }


def log_votes(sims: Tensor, labels: Tensor, num_classes: int, temperature: float) -> Tensor:
    """``[q, C]`` float64 ``log Σ exp(sim / T)`` over each class's neighbours (``sims``, ``labels``:
    ``[q, k]``), ``-inf`` for a class without one: each class's sum is shifted by its own best
    similarity (the module docstring), so none overflows or rounds to 0."""
    sims = sims.double()
    best = torch.full((len(sims), num_classes), -math.inf, dtype=torch.float64, device=sims.device)
    best.scatter_reduce_(1, labels, sims, reduce="amax")
    shifted = ((sims - best.gather(1, labels)) / temperature).exp()  # in (0, 1], 1 at each class's best
    sums = torch.zeros_like(best).scatter_add_(1, labels, shifted)
    return best / temperature + sums.log()  # -inf + log 0 = -inf where no neighbour voted


def _neighbours(
    train: Tensor, test: Tensor, k: int, backend: str, query_chunk: int, memory_chunk: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """``(sims [q, k], ids [q, k])`` of the ``k`` nearest train rows, one query chunk at a time."""
    if backend == "torch":
        search = TorchExactSearch(train, train.device, None, query_chunk, memory_chunk)
        yield from search.search_blocks(test, k)
        return
    import faiss  # the FAISS backend only: the torch path needs no FAISS

    index = faiss.IndexFlatIP(train.shape[1])
    index.add(np.ascontiguousarray(train.cpu().numpy()))
    for start in range(0, len(test), query_chunk):
        sims, ids = index.search(np.ascontiguousarray(test[start : start + query_chunk].cpu().numpy()), k)
        yield torch.from_numpy(sims), torch.from_numpy(ids)


def topk_hits(rankings: Tensor, labels: Tensor, k: int) -> Tensor:
    """Bool ``[M]``: whether each label is among the first ``k`` classes of its ranking (top-1:
    ``k = 1``; top-5: ``k = 5``, capped at the classes ranked)."""
    if rankings.shape[0] != labels.shape[0]:
        raise ValueError(f"{rankings.shape[0]} rankings but {labels.shape[0]} labels")
    return (rankings[:, :k] == labels.reshape(-1, 1).to(rankings.device)).any(dim=1)
