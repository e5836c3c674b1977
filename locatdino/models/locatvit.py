"""timm registry entries for LocAtViT: ``locatvit_tiny_patch{16,8}_224``, ``locatvit_{small,base}_patch16_224``.

One entry per architecture, named as timm names its ViTs (``vit_small_patch8_224`` and the like). The
earlier short names ``locatvit_{tiny,small,base}`` are timm deprecations of the patch-16 entries: they
still create the model (a checkpoint or export that recorded one still loads) with timm's warning,
and ``timm.list_models`` leaves them out.

A LocAtViT is timm's ``VisionTransformer`` with ``attn_layer=GAugAttention`` and
``global_pool='prr'`` (docs/locatvit.md); ``dynamic_img_size`` is on by default because DINO feeds 224 px
and 96 px crops to the same model. No pretrained weights are hosted: load checkpoints with
:func:`locatdino.models.create_backbone`.
"""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import AttentionPoolPrr
from timm.models import (
    build_model_with_cfg,
    generate_default_cfgs,
    register_model,
    register_model_deprecations,
)
from timm.models.vision_transformer import VisionTransformer

from locatdino.models.gaug.attention import GAugAttention
from locatdino.models.locatify import locatify


def _create_locatvit(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformer:
    kwargs.setdefault("dynamic_img_size", True)
    kwargs.setdefault("global_pool", "prr")
    out_indices = kwargs.pop("out_indices", 3)
    model = build_model_with_cfg(
        VisionTransformer,
        variant,
        pretrained,
        feature_cfg={"out_indices": out_indices, "feature_cls": "getter"},
        attn_layer=GAugAttention,
        **kwargs,
    )
    # wire GAug to the input's patch grid (a features_only model wraps the ViT), PRR to PrrPool
    for module in model.modules():
        if isinstance(module, VisionTransformer):
            locatify(module, gaug=True, prr=isinstance(module.attn_pool, AttentionPoolPrr))
    return model


def _cfg(description: str) -> dict:
    """The pretrained cfg of an entry without released weights (no ``url``): what the model is, and
    the ImageNet input it is built for (what ``timm.data.resolve_data_config`` reads)."""
    return {
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        "description": description,
        "paper_name": "Locality-Attending Vision Transformer",
        "paper_ids": "arXiv:2603.04892",
        "notes": ("no pretrained weights are released: train with locatdino fit",),
    }


def _describe(vit: str) -> str:
    return f"LocAtViT: {vit} with GAug attention in every block and PRR pooling, randomly initialised"


default_cfgs = generate_default_cfgs(
    {
        "locatvit_tiny_patch16_224": _cfg(_describe("ViT-Ti/16")),
        "locatvit_tiny_patch8_224": _cfg(_describe("ViT-Ti/8")),
        "locatvit_small_patch16_224": _cfg(_describe("ViT-S/16")),
        "locatvit_base_patch16_224": _cfg(_describe("ViT-B/16")),
    }
)

_TINY = {"embed_dim": 192, "depth": 12, "num_heads": 3}
_SMALL = {"embed_dim": 384, "depth": 12, "num_heads": 6}
_BASE = {"embed_dim": 768, "depth": 12, "num_heads": 12}


@register_model
def locatvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Tiny/16: ViT-Ti/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_tiny_patch16_224", pretrained, **{**_TINY, "patch_size": 16, **kwargs})


@register_model
def locatvit_tiny_patch8_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Tiny/8: ViT-Ti/8 with GAug attention and PRR pooling (the CPU recipes' LocAtViT)."""
    return _create_locatvit("locatvit_tiny_patch8_224", pretrained, **{**_TINY, "patch_size": 8, **kwargs})


@register_model
def locatvit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Small/16: ViT-S/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_small_patch16_224", pretrained, **{**_SMALL, "patch_size": 16, **kwargs})


@register_model
def locatvit_base_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Base/16: ViT-B/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_base_patch16_224", pretrained, **{**_BASE, "patch_size": 16, **kwargs})


register_model_deprecations(
    __name__,
    {
        "locatvit_tiny": "locatvit_tiny_patch16_224",
        "locatvit_small": "locatvit_small_patch16_224",
        "locatvit_base": "locatvit_base_patch16_224",
    },
)
