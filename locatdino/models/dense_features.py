"""Dense patch features of a timm ViT or Swin for in-context segmentation (docs/locatvit.md).

A ViT's features are the patch tokens of one block; a Swin's (timm ``SwinTransformer``, LocAtSwin
included) the ``[h, w, C]`` map of one stage, by default the last (stride 32, 768 wide for Swin-T),
the map its head pools. :func:`feature_layers` and :func:`feature_map` say what a layer index can
pick and what it gives, so that every evaluation asks here rather than reading a ViT's attributes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import AttentionPoolPrr
from timm.models.swin_transformer import SwinTransformer
from torch import nn

from locatdino.models.baselines import PatchBaseline
from locatdino.models.token_grid import patch_size, token_grid


def feature_layers(model: nn.Module) -> int:
    """How many layers :func:`dense_features` can take features from: a ViT's blocks, a Swin's stages."""
    return len(model.layers) if isinstance(model, SwinTransformer) else len(model.blocks)


def feature_map(model: nn.Module, layer: int = -1) -> tuple[int, int]:
    """``(stride px, channels)`` of the :func:`dense_features` map at ``layer``: a ViT's patch and
    width at every block, a Swin stage's reduction and width, a baseline's patch and size."""
    if isinstance(model, SwinTransformer):
        info = model.feature_info[layer % len(model.layers)]
        return int(info["reduction"]), int(info["num_chs"])
    return patch_size(model)[0], int(model.embed_dim)


def dense_features(
    model: nn.Module,
    x: torch.Tensor,
    layer: int = -1,
    norm: bool = False,
    prr: bool = False,
    output_fmt: str = "NHWC",
) -> torch.Tensor:
    """Patch tokens of block ``layer`` as a feature map.

    The default (last block, no final norm, no PRR) is the Hummingbird reference choice for
    LocAtViT. ``norm`` applies the model's final norm; ``prr`` then applies PRR to all tokens
    (prefix included) without pooling, as the model does before its head.
    Works for vanilla and LocAtViT models at any input size that is a multiple of the patch size
    (models built with ``dynamic_img_size=True``, as :func:`create_backbone` does), and for the
    network-free baselines (``locatdino.models.baselines``), whose feature has no block, norm or PRR.
    A Swin's feature is a stage's map (the last: the inputs are multiples of 32 px), ``norm`` its final
    norm (last stage only, as timm), ``prr`` PRR over the map's tokens in the stage's heads.

    Args:
        model: a timm ``VisionTransformer`` or ``SwinTransformer``.
        x: images ``[B, 3, H, W]``.
        layer: block (Swin: stage) index, negative counts from the end.
        norm: apply the final norm ``model.norm``.
        prr: apply patch representation refinement (the model's, or a parameter-free one).
        output_fmt: ``"NHWC"`` → ``[B, h, w, C]``; ``"NCHW"`` → ``[B, C, h, w]``.
    """
    if output_fmt not in ("NHWC", "NCHW"):
        raise ValueError(f"output_fmt must be 'NHWC' or 'NCHW', got {output_fmt!r}")
    if isinstance(model, PatchBaseline):
        features = model(x)
        return features.permute(0, 3, 1, 2) if output_fmt == "NCHW" else features
    depth = feature_layers(model)
    if not -depth <= layer < depth:
        raise IndexError(f"layer {layer} out of range for a {depth}-block model")
    height, width = x.shape[-2:]
    h, w = token_grid(model, (height, width))
    if not model.dynamic_img_size and (height, width) != tuple(model.patch_embed.img_size):
        raise ValueError(
            f"input {height}×{width} px but the model was built for {model.patch_embed.img_size} without "
            "dynamic_img_size: build it with dynamic_img_size=True for other sizes"
        )

    if isinstance(model, SwinTransformer):
        return _swin_map(model, x, layer % depth, norm, prr, output_fmt)

    with_prefix = prr and model.num_prefix_tokens > 0
    (tokens,) = model.forward_intermediates(
        x,
        indices=[layer % depth],
        return_prefix_tokens=with_prefix,
        norm=norm,
        stop_early=True,
        output_fmt="NLC",
        intermediates_only=True,
    )
    if prr:
        patches, prefix = tokens if with_prefix else (tokens, tokens[:, :0])
        pool = model.attn_pool if isinstance(model.attn_pool, AttentionPoolPrr) else None
        num_heads = pool.num_heads if pool is not None else model.blocks[0].attn.num_heads
        refined = prr_tokens(torch.cat([prefix, patches], dim=1), num_heads, pool)
        tokens = refined[:, prefix.shape[1] :]

    features = tokens.reshape(tokens.shape[0], h, w, tokens.shape[-1])
    return features.permute(0, 3, 1, 2) if output_fmt == "NCHW" else features


def _swin_map(
    model: SwinTransformer, x: torch.Tensor, stage: int, norm: bool, prr: bool, output_fmt: str
) -> torch.Tensor:
    (features,) = model.forward_intermediates(x, indices=[stage], norm=norm, stop_early=True, intermediates_only=True)
    if prr:  # every token of the map, as LocAtSwin refines it before its head
        B, C, h, w = features.shape
        heads = model.layers[stage].blocks[0].attn.num_heads
        tokens = prr_tokens(features.flatten(2).transpose(1, 2), heads)
        features = tokens.transpose(1, 2).reshape(B, C, h, w)
    return features if output_fmt == "NCHW" else features.permute(0, 2, 3, 1)


def prr_tokens(x: torch.Tensor, num_heads: int, pool: AttentionPoolPrr | None = None) -> torch.Tensor:
    """PRR refinement of every token, ``[B, N, C] → [B, N, C]``, without the final pooling.

    timm's ``AttentionPoolPrr.forward`` pools to one token; dense features need all of them, so
    this repeats its (parameter-free) attention: q = k = v = the tokens split into heads. Its
    optional pre/post norms are applied when ``pool`` is given.
    """
    B, N, C = x.shape
    if pool is not None:
        x = pool.pre_norm(x)
    heads = x.reshape(B, N, num_heads, C // num_heads).transpose(1, 2)
    x = F.scaled_dot_product_attention(heads, heads, heads).transpose(1, 2).reshape(B, N, C)
    return pool.post_norm(x) if pool is not None else x
