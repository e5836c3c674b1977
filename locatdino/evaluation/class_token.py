"""Class-token probes on frozen embeddings (docs/evaluation.md): DINO's weighted k-NN and a logistic probe.

Both take ``[N, D]`` train / test embeddings with integer labels and return which test
embeddings they label right (``*_hits``, for intervals) or the top-1 accuracy in [0, 1]. The k-NN
is :func:`~locatdino.evaluation.knn_classifier.knn_classify` (the reference's vote, ``locatdino knn``'s) at one
``k``, capped at the train embeddings: ``compare`` runs it on whatever few labelled images a
dataset has. The linear probe is scikit-learn's ``LogisticRegression`` on standardised features
(lbfgs, multinomial).

:func:`class_embeddings` computes the embedding these probes read: the backbone's image
embedding (``model(x)`` with ``num_classes=0``: the class token after the final norm, PRR-refined
for LocAtViT), as DINO's k-NN evaluation takes it.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn

from locatdino.evaluation.augment import normalize as normalize_images
from locatdino.evaluation.features import eval_mode
from locatdino.evaluation.knn_classifier import knn_classify
from locatdino.evaluation.precision import autocast, encoder_for


def _check(train_feats: np.ndarray, train_labels: np.ndarray, test_feats: np.ndarray, test_labels: np.ndarray):
    train_feats, test_feats = np.asarray(train_feats, np.float64), np.asarray(test_feats, np.float64)
    train_labels, test_labels = np.asarray(train_labels), np.asarray(test_labels)
    if train_feats.ndim != 2 or test_feats.ndim != 2 or train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(f"probe features must be [N, D] with one D, got {train_feats.shape} and {test_feats.shape}")
    if len(train_labels) != len(train_feats) or len(test_labels) != len(test_feats):
        raise ValueError(
            f"{len(train_feats)}/{len(test_feats)} features but {len(train_labels)}/{len(test_labels)} labels"
        )
    if len(train_feats) == 0 or len(test_feats) == 0:
        raise ValueError("probe needs at least one train and one test embedding")
    return train_feats, train_labels, test_feats, test_labels


def knn_hits(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    k: int = 20,
    temperature: float = 0.07,
) -> np.ndarray:
    """Per test embedding, whether DINO's weighted k-NN classifier (k capped at N train) labels
    it right: booleans ``[N test]``, what an interval on top-1 needs."""
    train_feats, train_labels, test_feats, test_labels = _check(train_feats, train_labels, test_feats, test_labels)
    classes, train_ids = np.unique(train_labels, return_inverse=True)
    k = min(k, len(train_feats))
    rankings = knn_classify(
        torch.from_numpy(train_feats),
        torch.from_numpy(train_ids),
        torch.from_numpy(test_feats),
        (k,),
        temperature,
        num_classes=len(classes),
    )[k]
    return classes[rankings[:, 0].numpy()] == test_labels


def knn_accuracy(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    k: int = 20,
    temperature: float = 0.07,
) -> float:
    """Top-1 accuracy of :func:`knn_hits`."""
    return float(np.mean(knn_hits(train_feats, train_labels, test_feats, test_labels, k, temperature)))


def logistic_hits(
    train_feats: np.ndarray, train_labels: np.ndarray, test_feats: np.ndarray, test_labels: np.ndarray
) -> np.ndarray:
    """Per test embedding, whether a logistic-regression probe (standardised features, L2 penalty
    C = 1) labels it right: booleans ``[N test]``."""
    train_feats, train_labels, test_feats, test_labels = _check(train_feats, train_labels, test_feats, test_labels)
    if len(np.unique(train_labels)) < 2:  # one class: nothing to fit, the probe predicts it
        return test_labels == train_labels[0]
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    probe.fit(train_feats, train_labels)
    return probe.predict(test_feats) == test_labels


def logistic_accuracy(
    train_feats: np.ndarray, train_labels: np.ndarray, test_feats: np.ndarray, test_labels: np.ndarray
) -> float:
    """Top-1 accuracy of :func:`logistic_hits`."""
    return float(np.mean(logistic_hits(train_feats, train_labels, test_feats, test_labels)))


def class_embeddings(
    model: nn.Module, images: torch.Tensor, batch_size: int = 32, precision: str = "fp32"
) -> np.ndarray:
    """``[N, D]`` float32 image embeddings of uint8 ``images [N, 3, S, S]`` (frozen, eval mode;
    ``precision`` as ``FeatureExtractor``'s)."""
    device = next(model.parameters()).device
    model, precision = encoder_for(model, precision, device)
    out = []
    with eval_mode(model), torch.inference_mode(), autocast(precision, device):
        for s in range(0, len(images), batch_size):
            out.append(model(normalize_images(images[s : s + batch_size].to(device))).float().cpu())
    return torch.cat(out).numpy()
