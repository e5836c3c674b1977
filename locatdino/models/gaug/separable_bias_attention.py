"""``softmax(q kᵀ · scale + S) v`` for a separable patch bias S, fused for CPU training, chunked.

Why not ``F.scaled_dot_product_attention(q, k, v, attn_mask=S)`` with an autograd-tracked S: on
CPU, a mask that requires grad sends SDPA to its unfused math path (several ``[B, H, N, N]``
temporaries, the softmax saved for backward), about 2× the attention time and one N² tensor per
block kept alive until backward. This operator keeps SDPA's fused CPU kernel for the forward and
has its own backward, and never holds an ``[B, H, N, N]`` tensor:

- forward: over chunks of query rows, write the chunk's bias rows into one small buffer
  (:func:`~locatdino.models.gaug.bias_mask.write_bias_rows`) and run fused SDPA on that chunk;
  saved for backward: q, k, v, the output and the two small profiles;
- backward: per chunk, rebuild the bias rows, recompute the probabilities P in place, then
  ``dV += Pᵀ dO``, ``dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O))``, ``dQ = dS K · scale``,
  ``dK += dSᵀ Q · scale``, and reduce the patch block of dS onto the profiles.

Chunks are sized to keep each ``[B·H, rows, N]`` buffer around ``_CHUNK_BYTES`` on the CPU (8 MiB,
cache-sized; they live in reused per-thread :func:`~locatdino.models.gaug.scratch.scratch` buffers,
no fresh page faults) and ``_CUDA_CHUNK_BYTES`` on CUDA (64 MiB: few enough SDPA launches per block,
and at most a few percent of a ViT-S evaluation's peak memory at 1024 px). A CPU forward without
gradients in fp32/fp64 (evaluation) takes its own path instead, :func:`_evaluate`: chunks of heads
of one image within ``_EVAL_CHUNK_BYTES`` (32 MiB), the bias added by the ``q kᵀ`` product itself and the
softmax normalised after ``P v``. On CUDA this is the
fallback where FlexAttention is unavailable and the whole mask would not fit one chunk
(:func:`mask_fits_one_chunk`): it keeps the memory of large inputs at one chunk per block instead
of a ``[B, H, N, N]`` mask per block (3 GiB for ViT-S's 6 heads and 16 images at 1024 px, in bf16).

Forward and backward are registered custom operators (``torch.ops.locatdino.separable_bias_attention``
and ``…_backward``) with fake implementations: ``torch.compile``, ``torch.export`` and TorchScript
see one opaque node with known output shapes instead of tracing into the scratch buffers and
``out=`` products (which graph capture cannot follow).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from locatdino.models.gaug.bias_mask import profile_grads, write_bias_rows
from locatdino.models.gaug.scratch import scratch

_CHUNK_BYTES = 8 << 20  # CPU, with gradients
_EVAL_CHUNK_BYTES = 32 << 20  # CPU, without gradients: the scores of an image's heads, or of a head's rows
_CUDA_CHUNK_BYTES = 64 << 20
# row sums of exp(logits) for which the evaluation path skips the row max: e^-40 … e^60
_SUM_RANGE = (4.2e-18, 1.1e26)


def _budget(device_type: str) -> int:
    return _CUDA_CHUNK_BYTES if device_type == "cuda" else _CHUNK_BYTES


def _chunk_rows(batch_heads: int, seq_len: int, element_size: int, budget: int) -> int:
    return max(16, budget // (batch_heads * seq_len * element_size))


def _head_chunks(B: int, H: int, N: int, element_size: int, budget: int) -> list[tuple[int, slice, slice]]:
    """``(image, heads, query rows)`` of each chunk of a forward without gradients: heads of one
    image, or query rows of one head where a head's ``[N, N]`` scores exceed ``budget``."""
    head = N * N * element_size
    if head <= budget:
        heads = min(H, budget // head)
        return [(b, slice(h, min(H, h + heads)), slice(0, N)) for b in range(B) for h in range(0, H, heads)]
    rows = max(16, budget // (N * element_size))
    return [
        (b, slice(h, h + 1), slice(start, min(N, start + rows)))
        for b in range(B)
        for h in range(H)
        for start in range(0, N, rows)
    ]


def mask_fits_one_chunk(q: Tensor) -> bool:
    """Whether the whole ``[B, H, N, N]`` bias of ``q [B, H, N, d]`` is no larger than one chunk of
    this path on q's device: then the materialised mask costs no more memory, and SDPA's own
    backward needs no recomputation."""
    B, H, N, _ = q.shape
    return _chunk_rows(B * H, N, q.element_size(), _budget(q.device.type)) >= N


@torch.library.custom_op("locatdino::separable_bias_attention", mutates_args=())
def _attention(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, num_prefix: int, scale: float, needs_grad: bool
) -> Tensor:
    if not needs_grad and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64):
        return _evaluate(q, k, v, rows, cols, num_prefix, scale)
    B, H, N, _ = q.shape
    chunk = _chunk_rows(B * H, N, q.element_size(), _budget(q.device.type))
    out = _output_like(q)
    with torch.autocast(q.device.type, enabled=False):
        for start in range(0, N, chunk):
            stop = min(N, start + chunk)
            mask = scratch("mask", (B, H, stop - start, N), q.dtype, q.device)
            write_bias_rows(mask, rows, cols, num_prefix, start)
            chunk_out = F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=mask, scale=scale)
            if stop - start == N and chunk_out.stride() == out.stride():
                return chunk_out  # one chunk, already in the promised layout: no copy
            out[:, :, start:stop] = chunk_out
    return out


def _probabilities(
    q: Tensor, k: Tensor, rows: Tensor, cols: Tensor, num_prefix: int, scale: float, start: int
) -> tuple[Tensor, slice]:
    """Attention probabilities ``[G, n, N]`` of the ``n`` queries ``q [G, n, d]`` from ``start`` on
    (``k [G, N, d]``, profiles ``[G, h·w, ·]``) in a scratch buffer, and the slice of patch
    queries they cover: the bias rows written first, ``scale · q kᵀ`` added by the same product."""
    scores = scratch("scores", (q.shape[0], q.shape[1], k.shape[1]), q.dtype, q.device)
    patches = write_bias_rows(scores, rows, cols, num_prefix, start)
    scores.baddbmm_(q, k.transpose(1, 2), alpha=scale)
    return torch.softmax(scores, dim=-1, out=scratch("probs", scores.shape, q.dtype, q.device)), patches


def _evaluate(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, num_prefix: int, scale: float) -> Tensor:
    """The CPU forward without gradients, in fp32/fp64: per chunk of heads of one image (or of query
    rows of one head, :func:`_head_chunks`), ``exp`` of the logits (:func:`_exp_logits`) and
    ``(exp · v) / rowsum``, the chunk's scores held in cache.

    Why not SDPA with the mask chunk, as in training: a float mask costs SDPA's fused kernel an
    extra pass over every tile, where ``baddbmm`` adds the bias for free; and a chunk of rows over
    all heads (the backward's layout) is larger than any cache at large inputs (59 MB for 4 images
    at 448 px), so the bias went through memory twice. Why not ``torch.softmax``: its row max,
    ``exp`` and scaling passes cost 3× the ``exp`` alone; normalising the ``[n, d]`` output instead
    of the ``[n, N]`` probabilities leaves one ``exp`` and one sum over the scores (LocAtViT-S over
    ViT-S at 448 px on the CPU, both paths in one run: 1.13× instead of 1.21×). Reduced precision
    keeps SDPA, which accumulates in fp32.
    """
    B, H, N, _ = q.shape
    out = _output_like(q)
    v = v.contiguous()  # a view into timm's qkv output: P v reads each head's rows 3·H·d apart, 7 % slower
    for image, heads, queries in _head_chunks(B, H, N, q.element_size(), _EVAL_CHUNK_BYTES):
        qc, kc, vc, rc, cc = (t[image, heads] for t in (q, k, v, rows, cols))
        args = (qc[:, queries], kc, rc, cc, num_prefix, scale, queries.start)
        weights, sums = _exp_logits(*args, subtract_max=False)
        if not bool(((sums >= _SUM_RANGE[0]) & (sums <= _SUM_RANGE[1])).all()):
            weights, sums = _exp_logits(*args, subtract_max=True)
        torch.div(torch.bmm(weights, vc), sums, out=out[image, heads, queries])
    return out


def _exp_logits(
    q: Tensor, k: Tensor, rows: Tensor, cols: Tensor, num_prefix: int, scale: float, start: int, subtract_max: bool
) -> tuple[Tensor, Tensor]:
    """``exp`` of the logits ``[G, n, N]`` of the ``n`` queries ``q [G, n, d]`` from ``start`` on, in
    a scratch buffer, and their row sums ``[G, n, 1]``.

    Softmax is shift-invariant: the row max is subtracted only to keep ``exp`` in range, and
    :func:`_evaluate` asks for it (the chunk computed again, with one more pass) only where a row sum left
    ``_SUM_RANGE``: a logit above ~60 (``exp`` near overflow, or ``inf``), or a row whose every
    logit is below ~-40 (the weights near fp32's subnormals, losing digits). Within the range every
    weight that counts is a normal float and the result is softmax's to fp32 rounding.
    """
    scores = scratch("scores", (q.shape[0], q.shape[1], k.shape[1]), q.dtype, q.device)
    write_bias_rows(scores, rows, cols, num_prefix, start)
    scores.baddbmm_(q, k.transpose(1, 2), alpha=scale)
    if subtract_max:
        scores.sub_(scores.amax(-1, keepdim=True))
    weights = scores.exp_()
    return weights, weights.sum(-1, keepdim=True)


def _output_like(q: Tensor) -> Tensor:
    """``[B, H, N, d]`` laid out as ``[B, N, H, d]`` (SDPA's CPU layout): the caller's
    ``transpose(1, 2).reshape(B, N, H·d)`` is then free. The fake promises the same strides."""
    B, H, N, d = q.shape
    return q.new_empty(B, N, H, d).transpose(1, 2)


@_attention.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, rows: Tensor, cols: Tensor, num_prefix: int, scale: float, needs_grad: bool
) -> Tensor:
    return _output_like(q)


@torch.library.custom_op("locatdino::separable_bias_attention_backward", mutates_args=())
def _attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    rows: Tensor,
    cols: Tensor,
    num_prefix: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    B, H, N, d = q.shape
    flat = lambda t: t.reshape(B * H, *t.shape[2:])  # noqa: E731
    with torch.autocast(q.device.type, enabled=False):
        grad_out = grad_out.to(q.dtype)
        delta = flat((grad_out * out).sum(-1, keepdim=True))  # rowsum(dO ⊙ O), before flattening copies
        qf, kf, vf, do, rf, cf = map(flat, (q, k, v, grad_out, rows, cols))
        dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
        d_rows, d_cols = torch.zeros_like(rf), torch.zeros_like(cf)
        chunk = _chunk_rows(B * H, N, q.element_size(), _budget(q.device.type))
        for start in range(0, N, chunk):
            stop = min(N, start + chunk)
            probs, patches = _probabilities(qf[:, start:stop], kf, rf, cf, num_prefix, scale, start)
            beta = 0.0 if start == 0 else 1.0  # dk, dv start uninitialised: overwrite, then accumulate
            dv.baddbmm_(probs.transpose(1, 2), do[:, start:stop], beta=beta)
            scores = scratch("scores", probs.shape, q.dtype, q.device)  # free again: P is in "probs"
            d_scores = torch.bmm(do[:, start:stop], vf.transpose(1, 2), out=scores)
            d_scores.sub_(delta[:, start:stop]).mul_(probs)
            torch.bmm(d_scores, kf, out=dq[:, start:stop])
            dk.baddbmm_(d_scores.transpose(1, 2), qf[:, start:stop], beta=beta)
            if patches.stop > patches.start:
                first = patches.start + num_prefix - start
                block = d_scores[:, first:, num_prefix:]
                work = scratch("products", (*block.shape[:2], rf.shape[-1], cf.shape[-1]), rf.dtype, q.device)
                d_rows[:, patches], d_cols[:, patches] = profile_grads(block, rf[:, patches], cf[:, patches], work)
        dq.mul_(scale)
        dk.mul_(scale)
    unflat = lambda t: t.view(B, H, *t.shape[1:])  # noqa: E731
    return unflat(dq), unflat(dk), unflat(dv), unflat(d_rows), unflat(d_cols)


@_attention_backward.register_fake
def _(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    rows: Tensor,
    cols: Tensor,
    num_prefix: int,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(t.new_empty(t.shape) for t in (q, k, v, rows, cols))


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    q, k, v, rows, cols, num_prefix, scale, _ = inputs
    ctx.save_for_backward(q, k, v, output, rows, cols)
    ctx.num_prefix, ctx.scale = num_prefix, scale


def _backward(ctx, grad_out: Tensor) -> tuple:
    grads = _attention_backward(grad_out, *ctx.saved_tensors, ctx.num_prefix, ctx.scale)
    return *grads, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)


def separable_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    num_prefix: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention output ``[B, H, N, d]`` with the bias ``S[p, i·w+j] = rows[p, i]·cols[p, j]``
    added to the logits of patch queries on patch keys (prefix rows/columns get no bias).

    ``q, k, v [B, H, N, d]``; ``rows [B, H, h·w, h]``, ``cols [B, H, h·w, w]`` (fp32 fine under
    autocast: cast on write); ``scale`` defaults to ``d ** -0.5``. Differentiable in all five.
    Without a gradient to compute (evaluation, fp32/fp64 on the CPU) the bias is added by the ``q kᵀ``
    product itself, per chunk of heads of one image (``_EVAL_CHUNK_BYTES``), instead of through SDPA's mask.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    # decided out here, where autograd still sees the inputs; the budget itself is read inside the
    # operator, so TorchScript compiles no module global
    needs_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or rows.requires_grad or cols.requires_grad
    )
    return torch.ops.locatdino.separable_bias_attention(q, k, v, rows, cols, num_prefix, scale, needs_grad)
