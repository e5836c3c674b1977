"""DINOv2 release files (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``, docs/checkpoints.md) in timm's keys.

A release is a flat state dict in DINOv2's own layout: ``cls_token``, ``pos_embed`` (37 × 37 + 1: trained
at 518 px), ``mask_token`` (iBOT's, unused at inference), ``register_tokens`` ``[1, R, D]`` in the
``_reg4`` files, ``blocks.{i}.{ls1,ls2}.gamma`` and, for ViT-g, SwiGLU ``mlp.w12`` / ``mlp.w3``. Its
``mask_token`` names the layout (as timm's own ``checkpoint_filter_fn`` tells it apart). timm's
public ``vision_transformer.checkpoint_filter_fn`` does the conversion: the register models become
``no_embed_class`` models whose class token holds its position embedding, and SwiGLU maps onto
``SwiGLUPacked``. It needs the model, so the loader converts after building it, at the release's
own grid: the filter then has nothing to resample, and position embeddings are resampled by the
release's own rule (below), which the filter does not know. Training code with ``block_chunks``
stores ``blocks.{chunk}.{i}`` (``i`` the global block index), flattened here first.

Each release resamples position embeddings at other grids by its own rule: the plain models by the
scale factor (g + 0.1)/√N without antialiasing (``"dino"``), the register models to the exact size
with antialiasing (``"timm"``); :func:`release_pos_embed_rule` says which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from timm.models.vision_transformer import checkpoint_filter_fn as vit_filter
from torch import nn

_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.")


def is_dinov2_release(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether a flat state dict is in DINOv2's layout (it holds iBOT's ``mask_token`` or the
    registers under DINOv2's name)."""
    return "mask_token" in state_dict or "register_tokens" in state_dict


def unchunked(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A release's weights with training code's ``blocks.{chunk}.{i}`` flattened to ``blocks.{i}``."""
    return {_CHUNKED.sub(r"blocks.\1.", k): v for k, v in state_dict.items()}


def from_dinov2(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A DINOv2 release's weights (flat) in the keys of ``model`` (timm's ``vit_*_patch14[_reg4]_dinov2``,
    built at the release's grid), by timm's ``vision_transformer.checkpoint_filter_fn``
    (``mask_token`` dropped)."""
    return vit_filter(dict(state_dict), model)


def release_pos_embed_rule(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The rule a vanilla release was trained and evaluated with: ``"timm"`` (exact size, antialiased)
    for DINOv2 with registers (``register_tokens``, timm's ``reg_token``), ``"dino"`` (scale factor
    (g + 0.1)/√N) for DINO and DINOv2 without."""
    return "timm" if "reg_token" in state_dict or "register_tokens" in state_dict else "dino"
