"""A file of another model family than the model it is given for, refused in one line before any build.

Key-by-key comparison (:mod:`locatdino.models.checkpoints.mismatch`) names dozens of missing and
unexpected keys when a Swin Transformer file meets a ViT, or a DINOv3 (RoPE, no position embedding)
file a DINOv2 ViT; the family each side belongs to says the same in words a user can act on:

- Swin: ``layers.{s}.blocks.{i}.*`` (timm's and the official layout);
- DINOv3's RoPE ViT: the release layout (``storage_tokens`` / ``rope_embed.periods``) or timm's
  (``reg_token`` and ``blocks.{i}.gamma_1``, no ``pos_embed``);
- a ViT with absolute position embeddings: ``pos_embed`` and ``blocks.{i}.attn.qkv``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from timm.models.eva import Eva
from torch import nn

from locatdino.models.checkpoints.dinov3 import is_dinov3_model, is_dinov3_release, read_dinov3
from locatdino.models.checkpoints.mismatch import describe_architecture, swin_depths


def describe_swin(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """``"a Swin Transformer (96 wide, depths 2-2-6-2, /4)"`` from a Swin state dict; None for another layout."""
    stages = swin_depths(state_dict)
    if stages is None:
        return None
    depths = "-".join(map(str, stages))
    proj = state_dict.get("patch_embed.proj.weight")
    size = f"{int(proj.shape[0])} wide, " if proj is not None and proj.ndim == 4 else ""
    patch = f", /{int(proj.shape[-1])}" if proj is not None and proj.ndim == 4 else ""
    return f"a Swin Transformer ({size}depths {depths}{patch})"


def _is_timm_dinov3(state_dict: Mapping[str, torch.Tensor]) -> bool:
    return "reg_token" in state_dict and "blocks.0.gamma_1" in state_dict and "pos_embed" not in state_dict


def family_refusal(state_dict: Mapping[str, torch.Tensor], model: nn.Module, name: str) -> str | None:
    """Why ``state_dict`` (timm's keys, or DINOv3's release layout) belongs to another family than
    ``model`` (``name``), in one line; None when the families agree or cannot be told."""
    swin = describe_swin(state_dict)
    model_is_swin = hasattr(model, "layers") and not hasattr(model, "blocks")
    if swin and not model_is_swin:
        return f"holds {swin} but {name} is a {type(model).__name__}: name the Swin model the file is for"
    if model_is_swin and not swin and "patch_embed.proj.weight" in state_dict:
        found = describe_architecture(state_dict) or "ViT"
        return f"holds a {found} but {name} is a Swin Transformer: name the model the file is for"
    if is_dinov3_release(state_dict) and not is_dinov3_model(model):
        weights = read_dinov3(state_dict)
        hint = f": use {weights.timm_name()}" if weights.timm_name() else ""
        return (
            f"holds {weights.describe()} weights (RoPE, no position embedding) but {name} is a "
            f"{type(model).__name__}{hint}"
        )
    if _is_timm_dinov3(state_dict) and not isinstance(model, Eva):  # other RoPE ViTs are Evas too
        found = describe_architecture(state_dict) or "ViT"
        return f"holds DINOv3 {found} weights in timm's keys (RoPE, no position embedding) but {name} is not DINOv3's"
    if is_dinov3_model(model) and "pos_embed" in state_dict:
        found = describe_architecture(state_dict) or "ViT"
        return (
            f"holds a {found} with absolute position embeddings (DINO / DINOv2) but {name} is DINOv3's RoPE ViT: "
            "name the model the file is for"
        )
    return None
