"""DINO self-distillation (Caron et al. 2021; docs/pretraining.md): the cross-entropy between the
centred, sharpened teacher and the student over every (global, other view) pair (``loss``) and the
LightningModule that trains a student against its EMA teacher (``module``)."""

from locatdino.ssl.dino.loss import DINOLoss
from locatdino.ssl.dino.module import DINOModule

__all__ = ["DINOLoss", "DINOModule"]
