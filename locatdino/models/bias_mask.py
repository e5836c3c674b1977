"""The dense attention mask of a separable patch bias, written once, in place.

A separable bias S[p, i·w + j] = rows[p, i] · cols[p, j] over the patch block of an
``[N, N]`` mask (prefix rows and columns zero) is written with one outer product straight into
one preallocated ``[B, H, N, N]`` tensor: no patch-only bias copied into a padded tensor, no
``[B, H, N, N, 2]`` intermediate. Autograd cannot follow an ``out=`` write, so the write is an
autograd Function whose backward reduces the mask gradient back onto the two profiles.
"""

from __future__ import annotations

import torch


def write_outer_product(mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Fill ``mask [B, H, N, N]`` with the separable bias in place and return it.

    ``rows [B, H, h*w, h]``, ``cols [B, H, h*w, w]`` (any float dtype; cast on write).
    """
    B, H, num_patches, h = rows.shape
    w = cols.shape[-1]
    if num_prefix:
        mask[:, :, :num_prefix].zero_()
        mask[:, :, num_prefix:, :num_prefix].zero_()
    patch_block = mask[:, :, num_prefix:, num_prefix:].view(B, H, num_patches, h, w)
    torch.mul(rows.unsqueeze(-1), cols.unsqueeze(-2), out=patch_block)
    return mask


def reduce_to_profiles(
    grad_mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_prefix: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the profiles from the gradient of the mask (the transpose of the write).

    ``d rows[p, i] = Σ_j g[p, i, j] · cols[p, j]`` and ``d cols[p, j] = Σ_i g[p, i, j] · rows[p, i]``,
    each a batch of small matrix-vector products, accumulated in fp32.
    """
    B, H, num_patches, h = rows.shape
    w = cols.shape[-1]
    g = grad_mask[:, :, num_prefix:, num_prefix:].reshape(B, H, num_patches, h, w).float()
    grad_rows = torch.matmul(g, cols.unsqueeze(-1)).squeeze(-1)
    grad_cols = torch.matmul(rows.unsqueeze(-2), g).squeeze(-2)
    return grad_rows.to(rows.dtype), grad_cols.to(cols.dtype)


class _OuterProductMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: torch.Tensor, cols: torch.Tensor, num_prefix: int, dtype: torch.dtype) -> torch.Tensor:
        B, H, num_patches, _ = rows.shape
        n = num_patches + num_prefix
        mask = torch.empty(B, H, n, n, device=rows.device, dtype=dtype)
        write_outer_product(mask, rows, cols, num_prefix)
        ctx.save_for_backward(rows, cols)
        ctx.num_prefix = num_prefix
        return mask

    @staticmethod
    def backward(ctx, grad_mask: torch.Tensor):
        rows, cols = ctx.saved_tensors
        grad_rows, grad_cols = reduce_to_profiles(grad_mask, rows, cols, ctx.num_prefix)
        return grad_rows, grad_cols, None, None


def outer_product_mask(rows: torch.Tensor, cols: torch.Tensor, num_prefix: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, N, N]`` mask in ``dtype`` with ``S[p, i·w+j] = rows[p, i]·cols[p, j]`` on the patch
    block (N = num_prefix + h·w) and zeros on every prefix row and column; differentiable."""
    return _OuterProductMask.apply(rows, cols, num_prefix, dtype)
