"""The LocAt entry of a vanilla timm model and the other way round, for the lines that refuse a file
with GAug for a model without (or without GAug for a LocAt model) and say which name to use instead.

The pairs are the ones this package registers: ``vit_*`` ↔ ``locatvit_*`` (the same suffix: patch, size,
``_dinov3[_qkvb]``), ``swin_{tiny,base}_patch4_window7_224`` ↔ ``locatswin_{tiny,base}``.
"""

from __future__ import annotations

import re

import timm
from timm.models.swin_transformer import SwinTransformer
from torch import nn

_SWIN_ENTRIES = {"tiny": "swin_tiny_patch4_window7_224", "base": "swin_base_patch4_window7_224"}


def locat_entry(name: str, model: nn.Module) -> str:
    """The LocAt entry for vanilla ``name`` (``swin_tiny_patch4_window7_224`` → ``locatswin_tiny``), or
    the family's pattern (``a locatswin_* model``) when this package registers none for it."""
    base = timm.models.split_model_name_tag(name)[0]
    if isinstance(model, SwinTransformer):
        size = next((s for s, swin in _SWIN_ENTRIES.items() if base == swin), None)
        return f"locatswin_{size}" if size else "a locatswin_* model"
    return f"locat{base}" if base.startswith("vit_") and timm.is_model(f"locat{base}") else "a locatvit_* model"


def vanilla_entry(name: str, model: nn.Module) -> str:
    """The vanilla timm model of LocAt ``name`` (``locatswin_base`` → ``swin_base_patch4_window7_224``),
    or the family's (``the vanilla Swin``) when timm has no such name."""
    base = timm.models.split_model_name_tag(name)[0]
    if isinstance(model, SwinTransformer):
        match = re.fullmatch(r"locatswin_(\w+)", base)
        return _SWIN_ENTRIES.get(match[1] if match else "", "the vanilla Swin")
    plain = base.removeprefix("locat")
    return plain if plain != base and timm.is_model(plain) else "the vanilla ViT"
