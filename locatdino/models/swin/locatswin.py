"""LocAt on Swin: ``locatify_swin`` and the timm registry entries ``locatswin_tiny``, ``locatswin_base``.

A LocAtSwin is timm's ``SwinTransformer`` with GAug in every window attention
(:class:`~locatdino.models.swin.window_attention.LocAtWindowAttention`) and PRR (docs/locatvit.md) on the
last stage's normed ``[B, h, w, C]`` map, every token refined (split into the last stage's heads), before
the head pools it. Its state dict is timm's Swin keys plus ``layers.{i}.blocks.{j}.attn.gaug.*``, those
of the official LocAtSwin (PRR has no parameters), so checkpoints load both ways with ``strict=True``.
No pretrained weights are hosted.
"""

from __future__ import annotations

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.swin_transformer import SwinTransformer, WindowAttention, checkpoint_filter_fn
from torch import nn

from locatdino.models.dense_features import prr_tokens
from locatdino.models.swin.window_attention import LocAtWindowAttention


class MapPrr(nn.Module):
    """Parameter-free PRR of every token of a ``[B, h, w, C]`` map, returned in the same shape."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return prr_tokens(x.flatten(1, 2), self.num_heads).view_as(x)


class LocAtSwin(SwinTransformer):
    """timm's ``SwinTransformer`` with GAug window attention and PRR before the head.

    Built by the ``locatswin_*`` entries, or from any ``SwinTransformer`` in place by
    :func:`locatify_swin` (``locatdino.models.locatify``). ``prr`` is None for a GAug-only model.
    """

    prr: MapPrr | None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _add_gaug(self)
        self.prr = _last_stage_prr(self)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """PRR on the normed map ``[B, h, w, C]``, then timm's head (pooling, classifier)."""
        if self.prr is not None:
            x = self.prr(x)
        return super().forward_head(x, pre_logits=pre_logits)


def locatify_swin(model: SwinTransformer, gaug: bool = True, prr: bool = True) -> LocAtSwin:
    """Turn timm's ``SwinTransformer`` into a :class:`LocAtSwin` in place, keeping every weight.

    GAug (default init: var ≈ 1, alpha ≈ ln 2, over each block's window grid) joins every window
    attention; ``prr`` adds PRR before the head. Attention already LocAt is kept as it is.
    """
    if not isinstance(model, SwinTransformer):
        raise TypeError(f"locatify_swin needs a timm SwinTransformer, got {type(model).__name__}")
    if not isinstance(model, LocAtSwin):
        model.__class__ = LocAtSwin
        model.prr = None
    if gaug:
        _add_gaug(model)
    if prr and model.prr is None:
        model.prr = _last_stage_prr(model)
    return model


def _add_gaug(model: SwinTransformer) -> None:
    for module in model.modules():
        if type(module) is WindowAttention:
            LocAtWindowAttention.from_window_attention(module)


def _last_stage_prr(model: SwinTransformer) -> MapPrr:
    return MapPrr(model.layers[-1].blocks[0].attn.num_heads)


def _create_locatswin(variant: str, pretrained: bool = False, **kwargs) -> LocAtSwin:
    out_indices = kwargs.pop("out_indices", tuple(range(len(kwargs.get("depths", (1, 1, 3, 1))))))
    return build_model_with_cfg(
        LocAtSwin,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,  # Microsoft's Swin layout → timm's
        feature_cfg={"flatten_sequential": True, "out_indices": out_indices},
        **kwargs,
    )


def _cfg(swin: str) -> dict:
    """What the entry is and the ImageNet input it is built for (timm's Swin settings), no ``url``."""
    return {
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": True,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head.fc",
        "license": "apache-2.0",
        "description": f"LocAtSwin: {swin} with GAug in every window attention and PRR before the head",
        "paper_name": "Locality-Attending Vision Transformer",
        "paper_ids": "arXiv:2603.04892",
        "notes": ("no pretrained weights are released: train with locatdino fit",),
    }


default_cfgs = generate_default_cfgs({"locatswin_tiny": _cfg("Swin-T"), "locatswin_base": _cfg("Swin-B")})


@register_model
def locatswin_tiny(pretrained: bool = False, **kwargs) -> LocAtSwin:
    """LocAtSwin-Tiny: Swin-T (96 wide, depths 2-2-6-2, heads 3-6-12-24, window 7, patch 4)."""
    args = {"patch_size": 4, "window_size": 7, "embed_dim": 96, "depths": (2, 2, 6, 2), "num_heads": (3, 6, 12, 24)}
    return _create_locatswin("locatswin_tiny", pretrained, **{**args, **kwargs})


@register_model
def locatswin_base(pretrained: bool = False, **kwargs) -> LocAtSwin:
    """LocAtSwin-Base: Swin-B (128 wide, depths 2-2-18-2, heads 4-8-16-32, window 7, patch 4)."""
    args = {"patch_size": 4, "window_size": 7, "embed_dim": 128, "depths": (2, 2, 18, 2), "num_heads": (4, 8, 16, 32)}
    return _create_locatswin("locatswin_base", pretrained, **{**args, **kwargs})
