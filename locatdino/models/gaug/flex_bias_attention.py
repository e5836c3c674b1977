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
several models and resolutions, and for the kernel options tried) for this function only.

A variant's first call chooses its kernel options (:mod:`~locatdino.models.gaug.flex_options`:
tiles that fit the device's shared memory, tried in order) and is guarded: compilation errors
(no C compiler for Triton's launcher, an inductor or Triton failure such as a tile that needs
more shared memory than the device has) and errors of the first run, forward and backward (a
gradient-carrying call runs its backward once on the same shapes, because the backward kernels
compile lazily, at the first ``loss.backward()``, where nothing could fall back any more), move
on to the next option. The options that won are logged (INFO, loggers under
``locatdino.models.gaug``) and remembered per (dtype, head size, device capability); each
failure is logged with its full error text (WARNING; the traceback at DEBUG). When every
option failed, :class:`FlexAttentionUnavailable` is raised with all the errors and FlexAttention
is off for the process (:func:`flex_failure` says why); ``GAugAttention``'s ``auto`` path then
falls back to SDPA with the bias. :func:`flex_report` returns the whole record. Out of memory is
not a kernel failure and propagates. Elsewhere (CPU: tests, the fused CPU path is faster)
FlexAttention runs in its eager form, which supports the forward only.
"""

import functools
import logging
import traceback
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

from locatdino.models.gaug.flex_options import FlexOptions, candidates, device_properties, fitting, shared_memory_limit

log = logging.getLogger(__name__)

_MAX_VARIANTS = 64
_failure: str | None = None  # why FlexAttention is off in this process (None: usable)
_proven: dict[tuple, FlexOptions] = {}  # variant → the options its first call (and backward) succeeded with
_chosen: dict[str, FlexOptions] = {}  # (dtype, head size, capability) → the options that won last
_failed: list[dict[str, str]] = []  # every option that failed: for what, which, the full error


class FlexAttentionUnavailable(RuntimeError):
    """FlexAttention failed to compile or failed its first call on this machine."""


def flex_failure() -> str | None:
    """Why FlexAttention was switched off in this process, or None while it works."""
    return _failure


def flex_report() -> dict:
    """What was chosen and what failed so far in this process (for reports: ``benchmarks/gpu_check/``)."""
    return {
        "chosen": {key: options.name for key, options in _chosen.items()},
        "failed": [dict(entry) for entry in _failed],
        "off": _failure,
    }


def reset_flex_state() -> None:
    """Forget every choice and failure (each case of a check judged on its own; tests)."""
    global _failure
    _failure = None
    _proven.clear()
    _chosen.clear()
    _failed.clear()


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    num_prefix: int,
    scale: float,
    kernel: tuple[tuple[str, int], ...] = (),
) -> torch.Tensor:
    w = cols.shape[-1]

    def score_mod(score, b, head, q_idx, kv_idx):
        # prefix indices are clamped to patch 0 (a valid address) and their bias dropped by where
        p = (q_idx - num_prefix).clamp(min=0)
        t = (kv_idx - num_prefix).clamp(min=0)
        bias = rows[b, head, p, t // w] * cols[b, head, p, t % w]
        is_patch_pair = (q_idx >= num_prefix) & (kv_idx >= num_prefix)
        return torch.where(is_patch_pair, score + bias.to(score.dtype), score)

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale, kernel_options=dict(kernel) or None)


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


def _run(
    attend: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    num_prefix: int,
    scale: float,
    options: FlexOptions,
) -> torch.Tensor:
    """``attend`` with ``options``; the profiles are cast outside the compiled function, so the
    kernel's captured tensors are always its inputs (their gradients flow back through the cast)."""
    q, k, v, rows, cols = tensors
    dtype = options.profile_dtype(q.dtype)
    return attend(q, k, v, rows.to(dtype), cols.to(dtype), num_prefix, scale, options.kernel)


def _first_call(
    attend: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    num_prefix: int,
    scale: float,
    options: FlexOptions,
) -> torch.Tensor:
    """Run a new variant once with ``options``, its backward too when it carries gradients."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in tensors)  # same strides
        out = _run(attend, leaves, num_prefix, scale, options)
        torch.autograd.grad(out, [t for t in leaves if t.requires_grad], torch.ones_like(out))
    return _run(attend, tensors, num_prefix, scale, options)


def error_text(err: BaseException) -> str:
    """The whole message of ``err`` with its type, every line (a compile error's detail is its cause)."""
    return "".join(traceback.format_exception_only(type(err), err)).strip()


def _choice_key(q: torch.Tensor, props) -> str:
    where = f"sm {props.major}.{props.minor}" if props is not None else q.device.type
    return f"{str(q.dtype).removeprefix('torch.')}, head size {q.shape[-1]}, {where}"


@torch.compiler.disable  # inside a compiled backbone: run eagerly, its failures caught as they are outside
def _choose(
    attend: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    num_prefix: int,
    scale: float,
    variant: tuple,
) -> torch.Tensor:
    """First call of a new variant: the first fitting option from the last winner on that works.

    In a backbone compiled by ``torch.compile`` (``model.compile``) this call runs eagerly; once
    the variant has its proven options, the backbone recompiles with the kernel traced inline."""
    global _failure
    q = tensors[0]
    props = device_properties(q.device)
    key = _choice_key(q, props)
    limit = shared_memory_limit(props) if props is not None else None
    usable = fitting(candidates(q.dtype), q.shape[-1], q.dtype, limit)
    start = usable.index(_chosen[key]) if _chosen.get(key) in usable else 0
    errors = []
    for options in usable[start:]:
        try:
            out = _first_call(attend, tensors, num_prefix, scale, options)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001  (any compile / launch failure: try the next options)
            text = error_text(err)
            errors.append(f"{options.name}: {text}")
            _failed.append({"for": key, "options": options.name, "error": text})
            log.warning("FlexAttention with %s failed for %s:\n%s", options.name, key, text)
            log.debug("FlexAttention traceback", exc_info=err)
            continue
        if _chosen.get(key) != options:
            log.info("FlexAttention for %s: %s", key, options.name)
        _chosen[key] = _proven[variant] = options
        return out
    if not usable:
        errors.append(f"no kernel option fits the device's {limit} B of shared memory per block")
    _failure = f"every kernel option failed for {key}:" + "".join(f"\n- {e}" for e in errors)
    raise FlexAttentionUnavailable(f"FlexAttention failed on {q.device.type}: {_failure}")


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
    (fp32: the bias is added to the kernel's scores in their precision; the chosen options may
    cast them to q's dtype); ``scale`` defaults to ``d ** -0.5``. Differentiable in all five on
    CUDA (compiled kernels). Raises :class:`FlexAttentionUnavailable` when every kernel option
    failed to compile or run a variant's first call, and from then on in this process.
    """
    if _failure is not None:
        raise FlexAttentionUnavailable(f"FlexAttention is off in this process: {_failure}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tensors, attend = (q, k, v, rows, cols), _kernel(q.device)
    variant = _variant(tensors, num_prefix, scale)
    options = _proven.get(variant)
    if options is not None:
        return _run(attend, tensors, num_prefix, scale, options)
    return _choose(attend, tensors, num_prefix, scale, variant)
