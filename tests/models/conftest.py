"""Shared tiny models for the LocAtViT tests (geometry in tiny.py) to stay fast on CPU."""

import pytest
import timm
import torch

import locatdino  # noqa: F401  (registers locatvit_*)
from tests.models.tiny import TINY


@pytest.fixture
def tiny_vit():
    """A vanilla timm ViT with the tiny geometry, dynamic image size, no head."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", num_classes=0, dynamic_img_size=True, **TINY).eval()


@pytest.fixture
def tiny_locatvit():
    torch.manual_seed(0)
    return timm.create_model("locatvit_tiny_patch16_224", num_classes=0, **TINY).eval()
