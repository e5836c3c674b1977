"""PRR pooling that refines only the tokens it keeps: timm's ``AttentionPoolPrr`` for the class token.

PRR (docs/locatvit.md) is a parameter-free self-attention of every token over every token, then a
pool. With the class-token pool (``pool_type='token'``) timm computes all N attention rows and keeps
the first; the rows of softmax attention are independent, so the pooled output is the class query's
row alone, 1/N of the work (a ViT-S forward at 448 px spent 2–3 % of its time in the other rows).
The average pool needs every row and computes them all, as timm does. Dense features refine every
token with :func:`locatdino.models.dense_features.prr_tokens`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import AttentionPoolPrr


class PrrPool(AttentionPoolPrr):
    """timm's ``AttentionPoolPrr`` (same constructor, no parameters), attending from the pooled
    query only under ``pool_type='token'``. :meth:`from_timm` converts a timm pool in place."""

    @classmethod
    def from_timm(cls, pool: AttentionPoolPrr) -> PrrPool:
        pool.__class__ = cls
        return pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        x = self.pre_norm(x)
        tokens = x.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, N, D): q = k = v
        queries = tokens[:, :, :1] if self.pool == "token" else tokens
        if self.fused_attn:
            x = F.scaled_dot_product_attention(queries, tokens, tokens)
        else:
            attn = ((queries * self.scale) @ tokens.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ tokens
        x = self.post_norm(x.transpose(1, 2).reshape(B, queries.shape[2], C))
        return x[:, 0] if self.pool == "token" else x.mean(1)
