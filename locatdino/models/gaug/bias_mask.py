"""Writing a separable patch bias into an attention mask, in place, and its transpose.

The bias of a query patch p on key patch t = i·w + j is ``S[p, t] = rows[p, i] · cols[p, j]``
(docs/locatvit.md; see :mod:`locatdino.models.gaug.locality_bias`). It lives in the patch block of an
``[N, N]`` attention mask whose prefix rows and columns (class token, registers) are zero.
Each write is one outer product straight into a preallocated mask (or into a chunk of its rows):
no patch-only bias copied into a padded tensor, no ``[B, H, N, N, 2]`` intermediate. Neither
autograd nor graph capture (``torch.compile``, ``torch.export``) can follow an ``out=`` write, so
the full-mask version is a custom operator (``torch.ops.locatdino.outer_product_mask``, opaque to
graph capture) whose backward reduces the mask gradient back onto the two profiles.
"""

from __future__ import annotations

import torch
from torch import Tensor


def write_bias_rows(
    out: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_prefix: int, start: int = 0
) -> slice:
    """Fill ``out [..., n, N]``, the mask rows of queries ``start … start+n-1``, in place.

    ``rows [..., Np, h]`` and ``cols [..., Np, w]`` are the profiles of all ``Np = h·w`` patch
    queries (same leading dims as ``out``; any float dtype, cast on write). Returns the slice of
    patch queries the chunk covers (empty for a chunk of prefix queries only).
    """
    n, h, w = out.shape[-2], rows.shape[-1], cols.shape[-1]
    first_patch = max(start, num_prefix)  # first query row of the chunk that is a patch
    patches = slice(first_patch - num_prefix, start + n - num_prefix)
    if num_prefix:
        out[..., : first_patch - start, :].zero_()  # prefix query rows
        out[..., first_patch - start :, :num_prefix].zero_()  # prefix key columns
    if patches.stop > patches.start:
        block = out[..., first_patch - start :, num_prefix:].unflatten(-1, (h, w))
        torch.mul(rows[..., patches, :, None], cols[..., patches, None, :], out=block)
    return patches


def profile_grads(
    grad_block: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, work: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the profiles from the gradient of their patch block (transpose of the write).

    ``grad_block [..., m, h·w]`` (may be a strided view of a mask), ``rows [..., m, h]``,
    ``cols [..., m, w]`` for the same m queries: ``d rows[p, i] = Σ_j g[p, i, j] cols[p, j]`` and
    ``d cols[p, j] = Σ_i g[p, i, j] rows[p, i]``. Elementwise products reduced in place of a
    batched matmul, which would first copy the strided block; ``work`` (``[..., m, h, w]`` in the
    profiles' dtype) holds the products when given.
    """
    g = grad_block.unflatten(-1, (rows.shape[-1], cols.shape[-1]))
    grad_rows = torch.mul(g, cols.unsqueeze(-2), out=work).sum(-1)
    grad_cols = torch.mul(g, rows.unsqueeze(-1), out=work).sum(-2)
    return grad_rows, grad_cols


@torch.library.custom_op("locatdino::outer_product_mask", mutates_args=())
def _outer_product_mask(rows: Tensor, cols: Tensor, num_prefix: int, dtype: torch.dtype) -> Tensor:
    n = rows.shape[-2] + num_prefix
    mask = torch.empty(*rows.shape[:-2], n, n, device=rows.device, dtype=dtype)
    write_bias_rows(mask, rows, cols, num_prefix)
    return mask


@_outer_product_mask.register_fake
def _(rows: Tensor, cols: Tensor, num_prefix: int, dtype: torch.dtype) -> Tensor:
    n = rows.shape[-2] + num_prefix
    return rows.new_empty(*rows.shape[:-2], n, n, dtype=dtype)


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    rows, cols, num_prefix, _ = inputs
    ctx.save_for_backward(rows, cols)
    ctx.num_prefix = num_prefix


def _backward(ctx, grad_mask: Tensor) -> tuple:
    rows, cols = ctx.saved_tensors
    p = ctx.num_prefix
    grad_rows, grad_cols = profile_grads(grad_mask[..., p:, p:], rows, cols)
    return grad_rows.to(rows.dtype), grad_cols.to(cols.dtype), None, None


_outer_product_mask.register_autograd(_backward, setup_context=_setup_context)


def outer_product_mask(rows: Tensor, cols: Tensor, num_prefix: int, dtype: torch.dtype) -> Tensor:
    """Differentiable ``[..., N, N]`` mask in ``dtype`` holding the separable bias on the patch
    block (N = num_prefix + h·w) and zeros on every prefix row and column."""
    return torch.ops.locatdino.outer_product_mask(rows, cols, num_prefix, dtype)
