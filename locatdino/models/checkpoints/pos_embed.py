"""Position embeddings at another grid: timm's resampling or the reference DINO ViT's (docs/checkpoints.md).

A model built at its training grid (224 px / 16 = 14 × 14 for DINO) resamples the patch part of
``pos_embed`` on every forward at another grid. Two rules exist and differ by ~1e-2 on the
embeddings (2–3.5e-2 on last-block patch tokens at 448 px):

- ``"timm"``: ``resample_abs_pos_embed`` — bicubic to the exact target size, ``antialias=True``
  (PIL's bicubic kernel). What this project trains with; timm's default.
- ``"dino"``: the reference ViT's ``interpolate_pos_encoding`` — bicubic with
  ``scale_factor = (g + 0.1) / √N`` per axis (the +0.1 guards the float-to-int size), no
  antialiasing, the class-token embedding unchanged. Released DINO models were trained and
  evaluated with it, so their published Hummingbird / segmentation numbers at 448–512 px need it.

:func:`set_pos_embed_rule` picks the rule per model instance (the DINO one replaces the
instance's ``_pos_embed``, timm's single entry point for ``forward``, ``forward_features`` and
``forward_intermediates``); ``model.pos_embed_rule`` records the choice.
"""

from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

POS_EMBED_RULES = ("timm", "dino")


def dino_interpolate_pos_embed(pos_embed: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> torch.Tensor:
    """``pos_embed [1, P + N, D]`` (square ``√N × √N`` patch grid) resampled to ``grid = (h, w)``
    as the reference DINO ViT does; unchanged at the training grid."""
    num_patches = pos_embed.shape[1] - num_prefix_tokens
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"pos_embed {list(pos_embed.shape)} is not a square grid plus {num_prefix_tokens} "
            "prefix tokens: the DINO position-embedding rule needs a square training grid"
        )
    if tuple(grid) == (side, side):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = pos_embed.shape[-1]
    patches = F.interpolate(
        patches.reshape(1, side, side, dim).permute(0, 3, 1, 2),
        scale_factor=((grid[0] + 0.1) / side, (grid[1] + 0.1) / side),
        mode="bicubic",
    )
    return torch.cat([prefix, patches.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def _dino_pos_embed(self: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """timm 1.0's ``VisionTransformer._pos_embed`` with the reference's resampling (dynamic size)."""
    if self.pos_embed is None or not self.dynamic_img_size:
        return type(self)._pos_embed(self, x)
    batch, height, width, dim = x.shape
    pos_embed = dino_interpolate_pos_embed(
        self.pos_embed, (height, width), 0 if self.no_embed_class else self.num_prefix_tokens
    )
    x = x.view(batch, -1, dim)
    prefix = [t.expand(batch, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
    if self.no_embed_class:
        x = torch.cat([*prefix, x + pos_embed], dim=1)
    else:
        x = torch.cat([*prefix, x], dim=1) + pos_embed
    return self.pos_drop(x)


def position_rule(model: nn.Module) -> str:
    """How ``model`` places tokens at another grid, in a report's words: its ``pos_embed_rule``
    (``"timm"`` / ``"dino"``) where an absolute position embedding is resampled, ``"RoPE"`` for a
    rotary ViT (timm's ``Eva``: DINOv3, EVA-02) and ``"relative"`` for a Swin (its relative-position
    bias), which have nothing to resample."""
    if getattr(model, "pos_embed", None) is not None:
        return getattr(model, "pos_embed_rule", "timm")
    if isinstance(model, SwinTransformer):
        return "relative"
    return "RoPE" if getattr(model, "rope", None) is not None else getattr(model, "pos_embed_rule", "timm")


def set_pos_embed_rule(model: VisionTransformer, rule: str) -> VisionTransformer:
    """Resample ``model``'s position embeddings by ``rule`` (``"timm"`` or ``"dino"``) from now on."""
    if rule not in POS_EMBED_RULES:
        raise ValueError(f"position-embedding rule must be one of {POS_EMBED_RULES}, got {rule!r}")
    model.__dict__.pop("_pos_embed", None)
    if rule == "dino":
        model._pos_embed = types.MethodType(_dino_pos_embed, model)
    model.pos_embed_rule = rule
    return model
