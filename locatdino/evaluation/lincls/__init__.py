"""Linear classification on frozen class tokens (``locatdino lincls``, docs/evaluation.md): DINO's
``eval_linear`` protocol and DINOv2's lr-grid variant on cached features. Apart from the dense
linear probe (:mod:`locatdino.evaluation.linprobe.protocol`, ``locatdino linprobe``), which trains a
segmentation head on patch tokens."""

from locatdino.evaluation.lincls.features import LinearInput
from locatdino.evaluation.lincls.protocol import LinclsConfig, LinclsResult, linear_classification

__all__ = ["LinclsConfig", "LinclsResult", "LinearInput", "linear_classification"]
