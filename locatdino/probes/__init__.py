"""Probes on frozen features, apart from Hummingbird: DINO's weighted k-NN on the class token
(:mod:`locatdino.probes.knn`, ``locatdino knn``; during pretraining the Lightning callback
:class:`KnnMonitor`, imported lazily: it needs Lightning), linear classification of the class
tokens (:mod:`locatdino.probes.lincls`, ``locatdino lincls``), the class-token probes of
``compare`` (k-NN and logistic regression), and the paper's dense linear probe on patch tokens
(docs/evaluation.md, :mod:`locatdino.probes.dense_probe`, ``locatdino linprobe``)."""

from locatdino.probes.class_token import class_embeddings, knn_accuracy, logistic_accuracy
from locatdino.probes.knn import knn_classify, topk_hits

__all__ = ["KnnMonitor", "class_embeddings", "knn_accuracy", "knn_classify", "logistic_accuracy", "topk_hits"]


def __getattr__(name: str):
    if name == "KnnMonitor":
        from locatdino.probes.knn_monitor import KnnMonitor

        return KnnMonitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
