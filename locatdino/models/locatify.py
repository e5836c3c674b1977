"""Turn any timm ``VisionTransformer``, RoPE ViT (``Eva``) or ``SwinTransformer`` into its LocAt version in
place (GAug in every block, PRR pooling)."""

from __future__ import annotations

from timm.layers import Attention, AttentionPoolPrr
from timm.models.eva import Eva
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

from locatdino.models.gaug.attention import GAugAttention, GAugKernels
from locatdino.models.gaug.patch_grid import install_patch_grid
from locatdino.models.prr import PrrPool
from locatdino.models.rope import add_gaug_to_blocks
from locatdino.models.swin.locatswin import locatify_swin


def locatify(
    model: VisionTransformer | Eva | SwinTransformer, gaug: bool = True, prr: bool = True
) -> VisionTransformer | Eva | SwinTransformer:
    """Add GAug and/or PRR to ``model`` in place and return it.

    Every existing weight is kept (e.g. a ViT loaded from DINO weights, with or without register
    tokens); the new GAug parameters get their default initialisation (var ≈ 1, alpha ≈ ln 2),
    so the model is not the same function afterwards. PRR is parameter-free: timm's
    ``global_pool='prr'`` after the final norm, pooling the class token (or the average when the
    model has none), as :class:`~locatdino.models.prr.PrrPool` (which attends from the class token
    alone; a timm ``AttentionPoolPrr`` already there is converted). Blocks that already hold
    ``GAugAttention`` (e.g. a ``VisionTransformer(attn_layer=GAugAttention)``) are only wired to
    the patch grid; the GAug constants follow the model's build grid ``model.patch_embed.grid_size``.

    A RoPE ViT (timm's ``Eva``: DINOv3, EVA-02, ``vit_*_rope_*``) gets GAug on its RoPE attention,
    computed from the queries before the rotation (:mod:`locatdino.models.rope`); its registers,
    LayerScale and every other weight are kept alike. A timm ``SwinTransformer`` becomes a LocAtSwin
    (:func:`~locatdino.models.swin.locatify_swin`).
    """
    if isinstance(model, SwinTransformer):
        return locatify_swin(model, gaug=gaug, prr=prr)
    if not isinstance(model, (VisionTransformer, Eva)):
        raise TypeError(
            f"locatify needs a timm VisionTransformer, Eva (RoPE ViT) or SwinTransformer, got {type(model).__name__}"
        )
    if gaug or any(isinstance(block.attn, GAugKernels) for block in model.blocks):
        add_gaug_to_blocks(model) if isinstance(model, Eva) else _add_gaug(model)
    if prr:
        _add_prr(model)
    return model


def _add_gaug(model: VisionTransformer) -> None:
    patch_grid = install_patch_grid(model)
    build_grid = tuple(model.patch_embed.grid_size)
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if type(attn) is Attention:
            attn = GAugAttention.from_attention(attn)
        elif not isinstance(attn, GAugAttention):
            raise TypeError(f"blocks.{i}.attn is {type(attn).__name__}: GAug extends timm.layers.Attention only")
        attn.gaug.set_build_grid(build_grid)
        attn.patch_grid = patch_grid


def _add_prr(model: VisionTransformer | Eva) -> None:
    if isinstance(model.attn_pool, AttentionPoolPrr):
        PrrPool.from_timm(model.attn_pool)
        return
    if model.attn_pool is not None:
        raise ValueError(
            f"model already pools with {type(model.attn_pool).__name__} (global_pool='{model.global_pool}')"
        )
    weight = model.patch_embed.proj.weight
    model.attn_pool = PrrPool(
        model.embed_dim,
        num_heads=model.blocks[0].attn.num_heads,
        pool_type="token" if model.cls_token is not None else "avg",
        device=weight.device,
        dtype=weight.dtype,
    )
    model.global_pool = "prr"
    if isinstance(model, VisionTransformer):
        model.pool_include_prefix = True
