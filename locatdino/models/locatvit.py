"""timm registry entries for LocAtViT: ``locatvit_{tiny,small,base}_patch16_224`` (+ short aliases).

A LocAtViT is timm's ``VisionTransformer`` with ``attn_layer=GAugAttention`` and
``global_pool='prr'`` (docs/locatvit.md); ``dynamic_img_size`` is on by default because DINO feeds 224 px
and 96 px crops to the same model. No pretrained weights are hosted: load checkpoints with
:func:`locatdino.models.create_backbone`.
"""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
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
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        attn_layer=GAugAttention,
        **kwargs,
    )
    # wire GAug to the input's patch grid (a features_only model wraps the ViT)
    for module in model.modules():
        if isinstance(module, VisionTransformer):
            locatify(module, gaug=True, prr=False)
    return model


def _cfg(**kwargs) -> dict:
    return {
        "url": "",
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
        **kwargs,
    }


default_cfgs = generate_default_cfgs(
    {
        "locatvit_tiny_patch16_224": _cfg(),
        "locatvit_small_patch16_224": _cfg(),
        "locatvit_base_patch16_224": _cfg(),
    }
)

_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
_BASE = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)


@register_model
def locatvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Tiny/16: ViT-Ti/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_tiny_patch16_224", pretrained, **dict(_TINY, **kwargs))


@register_model
def locatvit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Small/16: ViT-S/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_small_patch16_224", pretrained, **dict(_SMALL, **kwargs))


@register_model
def locatvit_base_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """LocAtViT-Base/16: ViT-B/16 with GAug attention and PRR pooling."""
    return _create_locatvit("locatvit_base_patch16_224", pretrained, **dict(_BASE, **kwargs))


@register_model
def locatvit_tiny(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """Alias of ``locatvit_tiny_patch16_224``."""
    return locatvit_tiny_patch16_224(pretrained, **kwargs)


@register_model
def locatvit_small(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """Alias of ``locatvit_small_patch16_224``."""
    return locatvit_small_patch16_224(pretrained, **kwargs)


@register_model
def locatvit_base(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """Alias of ``locatvit_base_patch16_224``."""
    return locatvit_base_patch16_224(pretrained, **kwargs)
