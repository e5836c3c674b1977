"""Dense patch features of a timm ViT for in-context segmentation (docs/locatvit.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import AttentionPoolPrr
from timm.models.vision_transformer import VisionTransformer

from locatdino.models.baselines import PatchBaseline
from locatdino.models.token_grid import token_grid


def dense_features(
    model: VisionTransformer,
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

    Args:
        model: a timm ``VisionTransformer``.
        x: images ``[B, 3, H, W]``.
        layer: block index, negative counts from the end.
        norm: apply the final norm ``model.norm``.
        prr: apply patch representation refinement (the model's, or a parameter-free one).
        output_fmt: ``"NHWC"`` → ``[B, h, w, C]``; ``"NCHW"`` → ``[B, C, h, w]``.
    """
    if output_fmt not in ("NHWC", "NCHW"):
        raise ValueError(f"output_fmt must be 'NHWC' or 'NCHW', got {output_fmt!r}")
    if isinstance(model, PatchBaseline):
        features = model(x)
        return features.permute(0, 3, 1, 2) if output_fmt == "NCHW" else features
    depth = len(model.blocks)
    if not -depth <= layer < depth:
        raise IndexError(f"layer {layer} out of range for a {depth}-block model")
    height, width = x.shape[-2:]
    h, w = token_grid(model, (height, width))
    if not model.dynamic_img_size and (height, width) != tuple(model.patch_embed.img_size):
        raise ValueError(
            f"input {height}×{width} px but the model was built for {model.patch_embed.img_size} without "
            "dynamic_img_size: build it with dynamic_img_size=True for other sizes"
        )

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
