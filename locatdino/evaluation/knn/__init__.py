"""``locatdino knn``: DINO's weighted k-NN classification of frozen class tokens (top-1, top-5).

The vote itself is the evaluation floor's (:mod:`locatdino.evaluation.knn_classifier`, shared with
``compare``'s class-token probes); here are the command (``cli``), its report (``report``) and,
during pretraining, the Lightning callback :class:`KnnMonitor` (imported lazily: it needs Lightning).
"""

__all__ = ["KnnMonitor"]


def __getattr__(name: str):
    if name == "KnnMonitor":
        from locatdino.evaluation.knn.monitor import KnnMonitor

        return KnnMonitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
