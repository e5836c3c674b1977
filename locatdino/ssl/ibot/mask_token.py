"""The learned mask token of masked image modelling (iBOT, DINOv2; docs/pretraining.md).

Masked patches are replaced by one learned embedding *after* the patch embedding and *before*
the position embedding is added, as both references do: a masked token keeps its grid position
(its position embedding) and loses only its content. The replacement is a forward hook on the
backbone's ``patch_embed`` (the module every timm forward runs first), so the backbone's own
``forward_features`` runs unchanged — position-embedding resampling, gradient checkpointing,
``torch.compile``, FSDP — and nothing of timm is forked. LocAtViT's GAug treats a masked token
as any patch (docs/locatvit.md): its bias as a query is a Gaussian centred on its grid position, with
width and amplitude predicted from its own query, and as a key it gets the other queries' bias by
grid distance; inside a masked block its nearest keys are therefore other mask tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class MaskToken(nn.Module):
    """``token`` ``[1, D]`` (zeros at init, as in both references) put in place of masked patches.

    :meth:`attach` hooks it to a backbone once; inside :meth:`masking` the backbone's patch
    embeddings of the masked patches are replaced, outside it the backbone is untouched. The mask
    is a bool tensor ``[B, h·w]`` (row-major over the patch grid: timm's token order).
    """

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, embed_dim))
        self._masks: Tensor | None = None

    def attach(self, backbone: nn.Module) -> None:
        """Hook onto ``backbone.patch_embed`` (a timm ViT's); the hook lives as long as the backbone."""
        backbone.patch_embed.register_forward_hook(self._replace)

    @contextmanager
    def masking(self, masks: Tensor) -> Iterator[None]:
        """Backbone forwards inside this block see the patches of ``masks`` replaced."""
        self._masks = masks
        try:
            yield
        finally:
            self._masks = None

    def _replace(self, module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        masks = self._masks
        if masks is None:
            return out
        # patch embeddings are [B, h, w, D] (dynamic image size) or [B, N, D]
        if masks.shape[0] != out.shape[0] or masks.shape[1] != out.shape[1:-1].numel():
            raise ValueError(
                f"MaskToken: masks {tuple(masks.shape)} do not fit the patch embeddings "
                f"{tuple(out.shape)} (need [B, h·w])"
            )
        return torch.where(masks.reshape(*out.shape[:-1], 1), self.token.to(out.dtype), out)
