"""Hummingbird in-context segmentation (FAISS nearest-neighbour patch retrieval): memory bank,
FAISS index, label transfer, the evaluator, its reports and monitor.

What every frozen-backbone evaluation shares (splits, views, the frozen encoder, the mIoU,
per-image confusions and intervals, provenance, options) is one floor below, in
:mod:`locatdino.evaluation`. Typical use::

    from locatdino.evaluation import load_backbone
    from locatdino.evaluation.hbird import HummingbirdConfig, hummingbird
    result = hummingbird(load_backbone("locatvit_small_patch16_224", "last.ckpt"), train_set, val_set,
                         HummingbirdConfig(input_size=448))
    print(result.miou)

Command line: ``locatdino hbird`` (:mod:`locatdino.evaluation.hbird.cli`). During pretraining:
the Lightning callback :class:`HummingbirdMonitor` (imported lazily: it needs Lightning).
"""

from locatdino.evaluation.hbird.evaluate import (
    HummingbirdConfig,
    HummingbirdResult,
    build_memory,
    evaluate_queries,
    hummingbird,
)
from locatdino.evaluation.hbird.index import PatchIndex
from locatdino.evaluation.hbird.memory import MemoryBank
from locatdino.evaluation.hbird.patch_labels import patch_class_counts, soft_labels
from locatdino.evaluation.hbird.report import HBIRD_LAYOUT, load_results
from locatdino.evaluation.hbird.sampling import patches_per_image, rare_class_first
from locatdino.evaluation.hbird.transfer import predict, transfer_labels

__all__ = [
    "HBIRD_LAYOUT",
    "HummingbirdConfig",
    "HummingbirdMonitor",
    "HummingbirdResult",
    "MemoryBank",
    "PatchIndex",
    "build_memory",
    "evaluate_queries",
    "hummingbird",
    "load_results",
    "patch_class_counts",
    "patches_per_image",
    "predict",
    "rare_class_first",
    "soft_labels",
    "transfer_labels",
]


def __getattr__(name: str):
    if name == "HummingbirdMonitor":
        from locatdino.evaluation.hbird.monitor import HummingbirdMonitor

        return HummingbirdMonitor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
