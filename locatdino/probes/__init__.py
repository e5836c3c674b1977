"""Probes on frozen features, apart from Hummingbird: the class-token k-NN and logistic
regression (docs/evaluation.md), and the paper's dense linear probe on patch tokens (docs/evaluation.md,
:mod:`locatdino.probes.dense_probe`, ``locatdino linprobe``)."""

from locatdino.probes.class_token import class_embeddings, knn_accuracy, logistic_accuracy

__all__ = ["class_embeddings", "knn_accuracy", "logistic_accuracy"]
