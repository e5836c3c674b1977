"""Probes on frozen features, apart from Hummingbird: the class-token k-NN and logistic
regression (SPEC §2.2)."""

from locatdino.probes.class_token import class_embeddings, knn_accuracy, logistic_accuracy

__all__ = ["class_embeddings", "knn_accuracy", "logistic_accuracy"]
