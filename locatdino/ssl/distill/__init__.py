"""Distillation from a frozen teacher: the objective (``module``), its frozen teacher and the grid
matching of its patch features (``teacher``) and its feature-matching loss (``loss``)."""

from locatdino.ssl.distill.loss import DistillLoss
from locatdino.ssl.distill.module import DistillModule

__all__ = ["DistillLoss", "DistillModule"]
