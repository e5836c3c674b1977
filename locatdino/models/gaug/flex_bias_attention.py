"""``softmax(q kᵀ · scale + S) v`` for the separable GAug bias through FlexAttention (SPEC §1.5).

Why: on CUDA the fallback materialises S as a differentiable ``[B, H, N, N]`` mask (12 heads ×
16.8 M entries per image per block at 1024 px, kept for backward) and sends SDPA to its
memory-efficient kernel. ``torch.nn.attention.flex_attention`` instead adds the bias inside a
fused kernel through a ``score_mod`` that reads the two small per-query profiles:

    S[p, t] = rows[p, i_t] · cols[p, j_t]   for patch query p and patch key t = i_t·w + j_t,

zero on every row and column of a prefix token (class token, registers), exactly as
:func:`~locatdino.models.gaug.bias_mask.write_bias_rows` writes the mask. The profiles are captured
tensors of the ``score_mod``, so FlexAttention's backward returns their gradients (its kernels
accumulate ``dS`` into them); no ``N × N`` tensor is formed in forward or backward.

On CUDA the function is compiled (inductor) once per (grid, prefix count, batch, dtype, grad
mode): the grid and prefix count are Python constants of the ``score_mod``, every other size is
static (``dynamic=False``), so each variant gets its own specialised kernel and dynamo's cache
keeps them. A DINO step alone needs three variants (student at 224 and 96 px, teacher at 224 px)
and evaluation adds one per resolution, which would exceed dynamo's default limit of 8 graphs
per function and silently fall back to the unfused eager path: the limit is raised to
``_MAX_VARIANTS`` for this function only. Elsewhere (CPU: tests, the fused CPU path is faster)
FlexAttention runs in its eager form, which supports the forward only.
"""

import functools

import torch
from torch.nn.attention.flex_attention import flex_attention

_MAX_VARIANTS = 64


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    rows: torch.Tensor, cols: torch.Tensor, num_prefix: int, scale: float,
) -> torch.Tensor:
    w = cols.shape[-1]

    def score_mod(score, b, head, q_idx, kv_idx):
        # prefix indices are clamped to patch 0 (a valid address) and their bias dropped by where
        p = (q_idx - num_prefix).clamp(min=0)
        t = (kv_idx - num_prefix).clamp(min=0)
        bias = rows[b, head, p, t // w] * cols[b, head, p, t % w]
        is_patch_pair = (q_idx >= num_prefix) & (kv_idx >= num_prefix)
        return torch.where(is_patch_pair, score + bias.to(score.dtype), score)

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)


@functools.cache
def _compiled_attend():
    """The compiled :func:`_attend`, made on first CUDA use (importing this module compiles nothing)."""
    compiled = torch.compile(_attend, dynamic=False)
    return torch._dynamo.config.patch(recompile_limit=_MAX_VARIANTS)(compiled)


@torch.jit.unused  # TorchScript takes the separable or mask path
def flex_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    num_prefix: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention output ``[B, H, N, d]`` with ``S[p, i·w+j] = rows[p, i]·cols[p, j]`` added to the
    logits of patch queries on patch keys; the same result as
    :func:`~locatdino.models.gaug.separable_bias_attention.separable_bias_attention`.

    ``q, k, v [B, H, N, d]`` of one dtype; ``rows [B, H, h·w, h]``, ``cols [B, H, h·w, w]``
    (fp32: the bias is added to the kernel's scores in their precision); ``scale`` defaults to
    ``d ** -0.5``. Differentiable in all five on CUDA (compiled kernels).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    attend = _compiled_attend() if q.device.type == "cuda" else _attend
    return attend(q, k, v, rows, cols, num_prefix, scale)
