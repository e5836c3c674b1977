"""Probes of global (class-token) features: DINO's weighted k-NN classifier (SPEC §2.2)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 accuracy in [0, 1] of the weighted k-NN vote: each test feature's ``k`` most
    cosine-similar train features vote for their label with weight ``exp(sim / temperature)``.

    ``train_feats`` ``[N, D]``, ``train_labels`` ``[N]`` int, ``test_feats`` ``[M, D]``,
    ``test_labels`` ``[M]`` int.
    """
    sims = F.normalize(test_feats.float(), dim=1) @ F.normalize(train_feats.float(), dim=1).T
    top, idx = sims.topk(min(k, len(train_feats)), dim=1)
    votes = torch.zeros(len(test_feats), int(train_labels.max()) + 1)
    votes.scatter_add_(1, train_labels[idx], (top / temperature).exp())
    return float((votes.argmax(1) == test_labels).float().mean())
