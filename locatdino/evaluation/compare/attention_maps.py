"""What a frozen ViT's attention looks at: the class token's last-block attention per head and,
for LocAtViT, the learned locality (GAug σ and α) of every block.

Both read each block's attention *input* through a forward hook and recompute the queries and
keys with the block's own layers (``qkv``, ``q_norm``, ``k_norm``, as timm's ``Attention``
does): fused attention kernels never materialise the attention matrix. The class-token row needs
no GAug term, since the locality bias is zero on every row of a prefix token (docs/locatvit.md).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from locatdino.evaluation.augment import normalize
from locatdino.evaluation.features import eval_mode
from locatdino.models.gaug.attention import GAugAttention
from locatdino.models.token_grid import token_grid


def _queries_keys(attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """``q, k [B, H, N, d_h]`` of a timm ``Attention`` for its input ``x [B, N, C]``."""
    B, N, _ = x.shape
    q, k, _ = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    return attn.q_norm(q), attn.k_norm(k)


def _attention_inputs(model: nn.Module, images: Tensor, blocks: list[int]) -> tuple[dict[int, Tensor], tuple[int, int]]:
    """Inputs of ``model.blocks[i].attn`` for each ``i`` in ``blocks`` and the patch grid, from one
    frozen forward of uint8 ``images``."""
    inputs: dict[int, Tensor] = {}
    hooks = [
        model.blocks[i].attn.register_forward_pre_hook(lambda _m, args, i=i: inputs.__setitem__(i, args[0]))
        for i in blocks
    ]
    x = normalize(images.to(next(model.parameters()).device))
    try:
        with eval_mode(model), torch.inference_mode():
            model.forward_features(x)
    finally:
        for hook in hooks:
            hook.remove()
    return inputs, token_grid(model, tuple(x.shape[-2:]))


def class_token_attention(model: nn.Module, images: Tensor) -> Tensor:
    """``[B, H, h, w]``: the last block's attention weights from the class token to every patch,
    per head (the prefix-token columns dropped, so rows sum to at most 1)."""
    last = len(model.blocks) - 1
    inputs, (h, w) = _attention_inputs(model, images, [last])
    attn = model.blocks[last].attn
    with torch.inference_mode():
        q, k = _queries_keys(attn, inputs[last].float())
        weights = ((q[:, :, :1] * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)[:, :, 0]
    return weights[:, :, -h * w :].reshape(weights.shape[0], weights.shape[1], h, w)


def locality_per_block(model: nn.Module, images: Tensor) -> list[dict[str, float]] | None:
    """Mean GAug ``sigma`` (√var over both axes, in patches at the images' grid) and ``alpha`` of
    every block over all heads and patch queries of ``images``; None for a model without GAug."""
    blocks = [i for i, b in enumerate(model.blocks) if isinstance(b.attn, GAugAttention)]
    if not blocks:
        return None
    inputs, grid = _attention_inputs(model, images, blocks)
    stats = []
    with torch.inference_mode():
        for i in blocks:
            attn = model.blocks[i].attn
            q, _ = _queries_keys(attn, inputs[i].float())
            var, alpha = attn.gaug.gaussian_parameters(q, grid)
            stats.append({"block": i, "sigma": float(var.sqrt().mean()), "alpha": float(alpha.mean())})
    return stats
