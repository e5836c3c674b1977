"""``softmax(q kᵀ · scale + S) v`` for the separable GAug bias through FlexAttention (docs/locatvit.md).

Why: on CUDA the fallback materialises S as a differentiable ``[B, H, N, N]`` mask (12 heads ×
16.8 M entries per image per block at 1024 px, kept for backward) and sends SDPA to its
memory-efficient kernel. ``torch.nn.attention.flex_attention`` instead adds the bias inside a
fused kernel through a ``score_mod`` that reads the two small per-query profiles:

    S[p, t] = rows[p, i_t] · cols[p, j_t]   for patch query p and patch key t = i_t·w + j_t,

zero on every row and column of a prefix token (class token, registers), exactly as
:func:`~locatdino.models.gaug.bias_mask.write_bias_rows` writes the mask. The profiles are captured
tensors of the ``score_mod``, so FlexAttention's backward returns their gradients (its kernels
accumulate ``dS`` into them); no ``N × N`` tensor is formed in forward or backward.

On CUDA the function is compiled (inductor) once per variant: the grid and prefix count are
Python constants of the ``score_mod`` and every other size, stride and dtype is static
(``dynamic=False``), so each (batch, grid, prefix count, dtype, grad mode) gets its own kernels.
A DINO run costs 3 compiles: teacher at 224 px without gradients, student at 224 px and at 96 px
with gradients (and their 2 backward kernels, compiled at their first backward); the shard
loader yields only full batches, so no other shape appears. Hummingbird adds one per batch size
at its input size (full batches of memory views and queries, the last partial one of each: at
most 3).
Past dynamo's default of 8 variants per function a new shape would silently run the unfused
eager FlexAttention, so the limit is raised to ``_MAX_VARIANTS`` (room for a comparison of
several models and resolutions in one process) for this function only.

A variant's first call is guarded: compilation errors (no C compiler for Triton's launcher, an
inductor or Triton failure) and errors of the first run, forward and backward (a gradient-
carrying call runs its backward once on the same shapes, because the backward kernels compile
lazily, at the first ``loss.backward()``, where nothing could fall back any more), raise
:class:`FlexAttentionUnavailable` and switch FlexAttention off for the process (:func:`flex_failure`
says why); ``GAugAttention``'s ``auto`` path then falls back to the materialised mask. Out of
memory is not a kernel failure and propagates. Elsewhere (CPU: tests, the fused CPU path is
faster) FlexAttention runs in its eager form, which supports the forward only.
"""

import functools
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

from locatdino.errors import first_line

_MAX_VARIANTS = 64
_failure: str | None = None  # why FlexAttention is off in this process (None: usable)
_proven: set[tuple] = set()  # variants whose first call (and backward) succeeded


class FlexAttentionUnavailable(RuntimeError):
    """FlexAttention failed to compile or failed its first call on this machine."""


def flex_failure() -> str | None:
    """Why FlexAttention was switched off in this process, or None while it works."""
    return _failure


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
def _compiled_attend() -> Callable[..., torch.Tensor]:
    """The compiled :func:`_attend`, made on first CUDA use (importing this module compiles nothing)."""
    compiled = torch.compile(_attend, dynamic=False)
    return torch._dynamo.config.patch(recompile_limit=_MAX_VARIANTS)(compiled)


def _kernel(device: torch.device) -> Callable[..., torch.Tensor]:
    return _compiled_attend() if device.type == "cuda" else _attend


def _variant(tensors: tuple[torch.Tensor, ...], num_prefix: int, scale: float) -> tuple:
    """What a compiled variant is specialised on (a superset of dynamo's guards)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return (num_prefix, scale, grad, *((t.shape, t.stride(), t.dtype, t.device) for t in tensors))


def _first_call(attend: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], *args) -> torch.Tensor:
    """Run a new variant once, its backward too when it carries gradients; any failure but out of
    memory switches FlexAttention off for the process."""
    global _failure
    try:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]  # same strides
            out = attend(*leaves, *args)
            torch.autograd.grad(out, [t for t in leaves if t.requires_grad], torch.ones_like(out))
        return attend(*tensors, *args)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (any compile / launch failure: the caller falls back)
        _failure = f"{type(err).__name__}: {first_line(err)[:200]}"
        raise FlexAttentionUnavailable(f"FlexAttention failed on {tensors[0].device.type}: {_failure}") from err


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
    ``d ** -0.5``. Differentiable in all five on CUDA (compiled kernels). Raises
    :class:`FlexAttentionUnavailable` when a variant fails to compile or run its first time, and
    from then on in this process.
    """
    if _failure is not None:
        raise FlexAttentionUnavailable(f"FlexAttention is off in this process: {_failure}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tensors, attend = (q, k, v, rows, cols), _kernel(q.device)
    key = _variant(tensors, num_prefix, scale)
    if key in _proven:
        return attend(*tensors, num_prefix, scale)
    out = _first_call(attend, tensors, num_prefix, scale)
    _proven.add(key)
    return out
