"""timm registry entries for LocAt on RoPE ViTs: the official ``locatvit_{tiny,base}_rope_mixed`` and
``locatvit_{small,small_plus,base,large}_patch16_dinov3[_qkvb]`` (DINOv3's architectures).

``locatvit_*_rope_mixed`` are the official code's names and equations (docs/locatvit.md): timm's
``Eva`` with mixed-mode RoPE (``rope_type='mixed'``, temperature 10, ``xy`` grid indexing), no
absolute position embedding, a class token, LayerScale from 1e-5 and ``AttentionRope`` blocks, GAug
on every block's RoPE attention and PRR before the head. Their state dicts are the official
model's key for key (``rope.freqs``, ``blocks.{i}.gamma_1``, ``blocks.{i}.attn.gaug.*``, ...).

``locatvit_*_patch16_dinov3[_qkvb]`` are timm's ``vit_*_patch16_dinov3[_qkvb]`` (4 registers,
LayerScale, DINOv3's RoPE; ``_qkvb`` with q / v biases) with the class-token pool, turned LocAt by
:func:`~locatdino.models.locatify.locatify`: a DINOv3 release loads into them with only GAug's
parameters left at their initialisation.

``dynamic_img_size`` is on by default, as for every LocAtViT entry (DINO feeds 224 px and 96 px
crops to one model); ``global_pool='prr'`` (the default) is the class-token pool refined by PRR,
any other pool drops PRR. No pretrained weights are hosted.
"""

from __future__ import annotations

import timm
from timm.models import (
    build_model_with_cfg,
    generate_default_cfgs,
    load_pretrained,
    register_model,
    resolve_pretrained_cfg,
)
from timm.models.eva import Eva, checkpoint_filter_fn

from locatdino.models.locatify import locatify
from locatdino.models.locatvit import _cfg

_ROPE_MIXED = {
    "patch_size": 16,
    "mlp_ratio": 4,
    "attn_type": "rope",
    "qkv_bias": True,
    "init_values": 1e-5,
    "class_token": True,
    "use_abs_pos_emb": False,
    "use_rot_pos_emb": True,
    "rope_type": "mixed",
    "rope_temperature": 10.0,
    "rope_grid_indexing": "xy",
}
_DINOV3_SIZES = ("small", "small_plus", "base", "large")


def _pool(kwargs: dict) -> bool:
    """Set the pool timm builds with in ``kwargs``; whether PRR is added on top."""
    kwargs.setdefault("dynamic_img_size", True)
    prr = kwargs.get("global_pool", "prr") == "prr"
    if prr:
        kwargs["global_pool"] = "token"
    return prr


def _locat_eva(model, prr: bool, pretrained: bool):
    """GAug and PRR in the Eva of ``model`` (a ``features_only`` model wraps it), then its weights
    (``pretrained``: the file or hub entry of its ``pretrained_cfg``, e.g. a ``locatdino export``): loaded
    after ``locatify``, since the file holds GAug's parameters, which the vanilla Eva has not."""
    for module in model.modules():
        if isinstance(module, Eva):
            locatify(module, gaug=True, prr=prr)
            if pretrained:
                load_pretrained(
                    module,
                    num_classes=module.num_classes,
                    in_chans=module.patch_embed.proj.in_channels,
                    filter_fn=checkpoint_filter_fn,
                )
    return model


def _create_rope_mixed(variant: str, pretrained: bool, **kwargs) -> Eva:
    prr = _pool(kwargs)
    out_indices = kwargs.pop("out_indices", 3)
    model = build_model_with_cfg(
        Eva,
        variant,
        False,  # the weights load once GAug is in (_locat_eva)
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg={"out_indices": out_indices, "feature_cls": "getter"},
        **{**_ROPE_MIXED, **kwargs},
    )
    return _locat_eva(model, prr, pretrained)


def _create_dinov3(variant: str, pretrained: bool, **kwargs) -> Eva:
    cfg = resolve_pretrained_cfg(
        variant,
        pretrained_cfg=kwargs.pop("pretrained_cfg", None),
        pretrained_cfg_overlay=kwargs.pop("pretrained_cfg_overlay", None),
    )
    if pretrained and not (cfg.file or cfg.url or cfg.hf_hub_id or cfg.state_dict):
        raise ValueError(
            f"{variant} has no released weights: load a DINOv3 release into it (locatdino's --model NAME:FILE)"
        )
    prr = _pool(kwargs)
    kwargs.setdefault("num_classes", cfg.num_classes)  # timm's DINOv3 cfgs say 0
    model = timm.create_model(variant.removeprefix("locat"), **kwargs)
    model.pretrained_cfg = model.default_cfg = {**cfg.to_dict(), "architecture": variant}
    return _locat_eva(model, prr, pretrained)


def _describe(vit: str) -> str:
    return f"LocAt {vit}: GAug on every block's RoPE attention and PRR pooling, randomly initialised"


default_cfgs = generate_default_cfgs(
    {
        "locatvit_tiny_rope_mixed": _cfg(_describe("mixed-RoPE ViT-Ti/16")),
        "locatvit_base_rope_mixed": _cfg(_describe("mixed-RoPE ViT-B/16")),
        **{
            f"locatvit_{size}_patch16_dinov3{bias}": _cfg(_describe(f"DINOv3 ViT-{size}/16{bias}"))
            for size in _DINOV3_SIZES
            for bias in ("", "_qkvb")
        },
    }
)


@register_model
def locatvit_tiny_rope_mixed(pretrained: bool = False, **kwargs) -> Eva:
    """LocAt mixed-RoPE ViT-Tiny/16 (the official ``locatvit_tiny_rope_mixed``)."""
    args = {"embed_dim": 192, "depth": 12, "num_heads": 3, **kwargs}
    return _create_rope_mixed("locatvit_tiny_rope_mixed", pretrained, **args)


@register_model
def locatvit_base_rope_mixed(pretrained: bool = False, **kwargs) -> Eva:
    """LocAt mixed-RoPE ViT-Base/16 (the official ``locatvit_base_rope_mixed``)."""
    args = {"embed_dim": 768, "depth": 12, "num_heads": 12, **kwargs}
    return _create_rope_mixed("locatvit_base_rope_mixed", pretrained, **args)


def _dinov3_entry(name: str):
    def entry(pretrained: bool = False, **kwargs) -> Eva:
        return _create_dinov3(name, pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = f"LocAt {name.removeprefix('locat')}: DINOv3's architecture with GAug and PRR."
    return register_model(entry)


for _size in _DINOV3_SIZES:
    for _bias in ("", "_qkvb"):
        _dinov3_entry(f"locatvit_{_size}_patch16_dinov3{_bias}")
