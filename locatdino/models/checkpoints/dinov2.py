"""DINOv2 release files (``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``, docs/checkpoints.md) in timm's keys.

A release is a flat state dict in DINOv2's own layout: ``cls_token``, ``pos_embed`` (37 × 37 + 1: trained
at 518 px), ``mask_token`` (iBOT's, unused at inference), ``register_tokens`` ``[1, R, D]`` in the
``_reg4`` files, ``blocks.{i}.{ls1,ls2}.gamma`` and, for ViT-g, SwiGLU ``mlp.w12`` / ``mlp.w3``. Its
``mask_token`` names the layout (as timm's own ``checkpoint_filter_fn`` tells it apart). timm's
conversion does the rest: the register models become ``no_embed_class`` models whose class token
holds its position embedding, and SwiGLU maps onto ``SwiGLUPacked``. Training code with
``block_chunks`` stores ``blocks.{chunk}.{i}`` (``i`` the global block index), flattened here first.

Each release resamples position embeddings at other grids by its own rule: the plain models by the
scale factor (g + 0.1)/√N without antialiasing (``"dino"``), the register models to the exact size
with antialiasing (``"timm"``); :func:`release_pos_embed_rule` says which from the converted weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from timm.models.vision_transformer import _convert_dinov2

_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.")


def is_dinov2_release(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether a flat state dict is in DINOv2's layout (it holds iBOT's ``mask_token`` or the
    registers under DINOv2's name)."""
    return "mask_token" in state_dict or "register_tokens" in state_dict


def from_dinov2(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DINOv2 release's weights in timm's ``vit_*_patch14[_reg4]_dinov2`` keys (``mask_token`` dropped)."""
    flat = {_CHUNKED.sub(r"blocks.\1.", k): v for k, v in state_dict.items()}
    return _convert_dinov2(flat, None)  # timm's conversion; it does not look at the model


def release_pos_embed_rule(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The rule a vanilla release was trained and evaluated with: ``"timm"`` (exact size, antialiased)
    for DINOv2 with registers (their ``reg_token``), ``"dino"`` (scale factor (g + 0.1)/√N) for DINO
    and DINOv2 without."""
    return "timm" if "reg_token" in state_dict else "dino"
