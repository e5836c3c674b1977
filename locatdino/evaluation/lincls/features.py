"""The input of the linear classifier: class tokens of the last blocks, and the mean patch token.

DINO's ``eval_linear`` feeds its linear layer the class tokens of the last ``n`` blocks, each
after the final norm, concatenated (``n = 4`` for ViT-S), and for ViT-B the last block's class
token with the mean of its patch tokens (``n = 1`` plus average pooling); DINOv2's linear
evaluation concatenates the same pieces in this order (class tokens of the blocks in depth
order, then the mean patch token). timm gives every piece in one forward:
``forward_intermediates(indices=n, norm=True, return_prefix_tokens=True)``.

With ``prr`` the last block's normed tokens are refined by PRR before its class token and mean
patch token are read: for LocAtViT that is the embedding pretraining shaped (the DINO head reads
the PRR-refined class token), where the reference, written for plain ViTs, has no PRR.

A Swin has no class token: its input is the average pool of its last stage's normed map (what its
head pools), PRR-refined first with ``prr`` (LocAtSwin's own embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from timm.layers import AttentionPoolPrr
from timm.models.swin_transformer import SwinTransformer
from torch import Tensor, nn

from locatdino.models.dense_features import dense_features, prr_tokens

BASE_WIDTH = 768  # ViT-B's: from this width on DINO takes 1 block + the mean patch token


@dataclass(frozen=True)
class LinearInput:
    """Which tokens of a frozen ViT make the linear layer's input ``[B, dim]``.

    Args:
        last_blocks: class tokens of this many last blocks, concatenated.
        avgpool: append the last block's mean patch token.
        prr: refine the last block's tokens with PRR first (see the module docstring).
        pooled: a Swin's input, the average pool of its last stage (``last_blocks`` 0, no ``avgpool``).
    """

    last_blocks: int = 4
    avgpool: bool = False
    prr: bool = False
    pooled: bool = False

    @classmethod
    def reference(
        cls, model: nn.Module, last_blocks: int | None = None, avgpool: bool | None = None, prr: bool = False
    ) -> LinearInput:
        """DINO's choice for ``model`` where an argument is None: 4 blocks (all, in a shallower
        model) without pooling below ViT-B's width, 1 block with pooling from it on;
        ``ValueError`` when ``model`` has fewer blocks than asked for or no class token. A Swin
        takes the average pool of its last stage (``pooled``)."""
        if isinstance(model, SwinTransformer):
            if last_blocks is not None or avgpool is not None:
                raise ValueError(
                    "--last-blocks and --avgpool pick a ViT's tokens: a Swin's linear input is the average pool "
                    "of its last stage"
                )
            return cls(last_blocks=0, avgpool=False, prr=prr, pooled=True)
        base, depth = int(model.embed_dim) >= BASE_WIDTH, len(model.blocks)
        last_blocks = min(1 if base else 4, depth) if last_blocks is None else last_blocks
        avgpool = base if avgpool is None else avgpool
        if not 1 <= last_blocks <= depth:
            raise ValueError(f"--last-blocks {last_blocks}: the model has {depth} blocks")
        if getattr(model, "cls_token", None) is None:
            raise ValueError(f"{type(model).__name__} has no class token to classify with")
        return cls(last_blocks, avgpool, prr)

    def dim(self, width: int) -> int:
        """The input's size for a model of ``width`` (timm's ``num_features``)."""
        return width if self.pooled else width * (self.last_blocks + self.avgpool)

    def __call__(self, model: nn.Module, images: Tensor) -> Tensor:
        """``[B, dim]`` float32 features of ImageNet-normalised ``images [B, 3, S, S]``."""
        if self.pooled:
            return dense_features(model, images, norm=True, prr=self.prr).mean((1, 2)).float()
        outputs = model.forward_intermediates(
            images,
            indices=self.last_blocks,
            norm=True,
            return_prefix_tokens=True,
            output_fmt="NLC",
            intermediates_only=True,
        )
        patches, prefix = outputs[-1]
        if self.prr:
            pool = model.attn_pool if isinstance(model.attn_pool, AttentionPoolPrr) else None
            heads = pool.num_heads if pool is not None else model.blocks[0].attn.num_heads
            refined = prr_tokens(torch.cat([prefix, patches], dim=1), heads, pool)
            prefix, patches = refined[:, : prefix.shape[1]], refined[:, prefix.shape[1] :]
            outputs = [*outputs[:-1], (patches, prefix)]
        pieces = [p[:, 0] for _, p in outputs[:-1]] + [prefix[:, 0]]
        if self.avgpool:
            pieces.append(patches.mean(1))
        return torch.cat(pieces, dim=-1).float()

    def to_dict(self) -> dict:
        tokens = {"last_blocks": self.last_blocks, "avgpool": self.avgpool, "prr": self.prr}
        return {**tokens, "pooled": True} if self.pooled else tokens
