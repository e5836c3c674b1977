"""Supervised classification pretraining (timm's DeiT recipe, the LocAtViT paper's main one;
docs/pretraining.md): one LightningModule, ``module``."""

from locatdino.ssl.supervised.module import SupervisedModule

__all__ = ["SupervisedModule"]
