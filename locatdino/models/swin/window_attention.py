"""GAug on Swin's window attention: the Gaussian locality bias over each window's grid (docs/locatvit.md).

Swin attends inside windows of ``Wh × Ww`` tokens (7 × 7) with a learned relative-position bias and,
in shifted blocks, a mask that keeps tokens from different image regions apart. GAug adds its
query-dependent bias S (:class:`~locatdino.models.gaug.locality_bias.GaussianLocalityBias`) on top of
both, computed on the window's own grid: every window is a grid of ``Wh × Ww`` patches without
prefix tokens, so GAug's build grid is the window (c = 49, eps = 0.1 for 7 × 7) and does not depend on
the image size. A window is small (49 tokens), so the ``[B·nW, H, N, N]`` bias is materialised as
timm's shift mask already is; the chunked and FlexAttention paths of ViT GAug are not needed here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from timm.models.swin_transformer import WindowAttention

from locatdino.models.gaug.locality_bias import GaussianLocalityBias


@register_notrace_module  # FX: a leaf, as timm's WindowAttention's callers expect a plain module
class LocAtWindowAttention(WindowAttention):
    """timm's ``WindowAttention`` plus GAug: ``softmax(q kᵀ/√d + B_rel + M_shift + S) v``.

    Same constructor, ``forward(x, mask=None)`` contract and parameter names as timm's class, plus
    ``gaug.log_var`` / ``gaug.log_alpha`` (3·d_h + 3 per block), the keys of the official
    ``LocAtWindowAttention``.
    """

    def __init__(self, dim: int, num_heads: int, **kwargs) -> None:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        super().__init__(dim, num_heads, **kwargs)
        self.gaug = GaussianLocalityBias(self.head_dim, self.window_size, device=device, dtype=dtype)

    @property
    def head_dim(self) -> int:
        return self.qkv.out_features // (3 * self.num_heads)

    @classmethod
    def from_window_attention(cls, attn: WindowAttention) -> LocAtWindowAttention:
        """Turn a timm ``WindowAttention`` into a ``LocAtWindowAttention`` in place, keeping every
        weight; GAug gets its default initialisation (var ≈ 1, alpha ≈ ln 2) on ``attn.qkv``'s
        device and dtype, its build grid the window."""
        if type(attn) is not WindowAttention:
            raise TypeError(f"GAug can only extend timm's WindowAttention, got {type(attn).__name__}")
        weight = attn.qkv.weight
        attn.__class__ = cls
        attn.gaug = GaussianLocalityBias(attn.head_dim, attn.window_size, device=weight.device, dtype=weight.dtype)
        return attn

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B·nW, N, C]`` (N = Wh·Ww tokens per window), ``mask [nW, N, N]`` (0 / -100) or None."""
        B_, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        bias = self.gaug(q, self.window_size) + self._get_rel_pos_bias()
        if mask is not None:
            num_win = mask.shape[0]
            bias = (bias.view(-1, num_win, self.num_heads, N, N) + mask[None, :, None]).view(-1, self.num_heads, N, N)
        dropout_p = self.attn_drop.p if self.training else 0.0
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)
        else:
            attn = self.attn_drop(self.softmax((q * self.scale) @ k.transpose(-2, -1) + bias))
            x = attn @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B_, N, -1)))
