"""GAug's Gaussian locality bias (docs/locatvit.md), the additive term S of ``softmax(q kᵀ/√d + S) v``.

For a query patch p at grid position (i_p, j_p) and a key patch t at (i_t, j_t)::

    S[p, t] = alpha_p · exp(d_row(i_p, i_t) / (var_p,row + eps) + d_col(j_p, j_t) / (var_p,col + eps))

with ``d(a, b) = max(-½(a - b)², clamp_min)``, ``var = c · sigmoid(log_var(q) - b)`` and
``alpha = softplus(log_alpha(q))``. The exponent is a row term plus a column term, so S is the
product of a per-query *row profile* (length h) and *column profile* (length w): the kernel is
built from two small ``[B, H, Np, h]`` / ``[B, H, Np, w]`` tensors and one outer product written
straight into the attention mask, never a ``[B, H, N, N, 2]`` distance intermediate. The profiles
are one custom operator with an analytic backward (``torch.ops.locatdino.gaussian_profiles``): as
~20 elementwise nodes on these small tensors they cost 7 % of a ViT-S training step on CPU.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from locatdino.models.gaug.bias_mask import outer_product_mask


def gaug_constants(build_grid: tuple[int, int]) -> tuple[float, float, float, float]:
    """``(c, b, eps, clamp_min)`` of docs/locatvit.md for a model built at patch grid ``build_grid``.

    ``c = G²`` (G the larger side) bounds the variance, ``b = ln(c - 1)`` makes a zero logit give
    variance 1, eps doubles until ``½(G-1)²/eps²`` fits fp16 (≤ 32 500), and ``-½Δ²`` is clamped
    at ``max(-½(G-1)², -6550)`` so larger inference grids cannot overflow fp16.
    """
    g = max(build_grid)
    c = float(g * g)
    b = math.log(c - 1.0) if c > 2 else 0.0
    half_span = 0.5 * (g - 1) ** 2
    eps = 0.1
    while half_span / eps**2 > 32_500:
        eps *= 2
    return c, b, eps, max(-half_span, -6550.0)


def _axis_distances(n: int, clamp_min: float, device: torch.device) -> Tensor:
    pos = torch.arange(n, device=device, dtype=torch.float32)
    return (-0.5 * (pos[:, None] - pos[None, :]) ** 2).clamp_(min=clamp_min)


def build_distance_table(h: int, w: int, clamp_min: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """Clamped ``-½Δ²`` of every query patch to every key row / column, fp32.

    Returns ``rows [h*w, h]`` and ``cols [h*w, w]``: ``rows[p, i] = max(-½(i_p - i)², clamp_min)``
    for query p = i_p·w + j_p (row-major, as timm flattens patches), likewise ``cols``.
    """
    rows = _axis_distances(h, clamp_min, device).repeat_interleave(w, dim=0)  # query p → its row i_p
    cols = _axis_distances(w, clamp_min, device).repeat(h, 1)  # query p → its column j_p
    return rows, cols


@functools.lru_cache(maxsize=64)
def distance_table(h: int, w: int, clamp_min: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """:func:`build_distance_table`, cached. Built outside inference mode so a table first made
    under ``torch.inference_mode()`` can still be used by a later training forward."""
    with torch.inference_mode(False):
        return build_distance_table(h, w, clamp_min, device)


_LOG_FLOOR = -30.0


@torch.library.custom_op("locatdino::gaussian_profiles", mutates_args=())
def _gaussian_profiles(
    z: Tensor,
    d_rows: Tensor,
    d_cols: Tensor,
    var_scale: float,
    shift: float,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``rows = alpha · exp(x_r)``, ``cols = exp(x_c)`` with ``x = max(d / (var + eps), _LOG_FLOOR)``.

    Input ``z [..., 3]``: the logits (log-var row, log-var column, log-alpha); ``var = var_scale ·
    sigmoid(z_var - shift)``, ``alpha = softplus(z_alpha)``. The floor keeps every factor ≥ e⁻³⁰
    ≈ 1e-13 (invisible next to fp32 logits) so no product rows·cols is a subnormal float: x86
    arithmetic on subnormals is an order of magnitude slower (2× on the whole mask write).
    Returns ``rows, cols`` and, for the backward only, ``e_rows = exp(x_r)``, ``sig``, ``inv =
    1 / (var + eps)`` and ``alpha``. A custom operator with an analytic backward: one node instead
    of ~20 elementwise autograd nodes, and opaque to graph capture and TorchScript.
    """
    sig = torch.sigmoid(z[..., :2] - shift)
    inv = (sig * var_scale + eps).reciprocal_()  # 1 / (var + eps), [..., 2]
    alpha = F.softplus(z[..., 2:].contiguous())  # on the strided column: 8× slower
    e_rows = (d_rows * inv[..., 0:1]).clamp_(min=_LOG_FLOOR).exp_()
    cols = (d_cols * inv[..., 1:2]).clamp_(min=_LOG_FLOOR).exp_()
    return alpha * e_rows, cols, e_rows, sig, inv, alpha


@_gaussian_profiles.register_fake
def _(z: Tensor, d_rows: Tensor, d_cols: Tensor, var_scale: float, shift: float, eps: float):
    lead = z.shape[:-1]
    h, w = d_rows.shape[-1], d_cols.shape[-1]
    return (
        z.new_empty(*lead, h),
        z.new_empty(*lead, w),
        z.new_empty(*lead, h),
        z.new_empty(*lead, 2),
        z.new_empty(*lead, 2),
        z.new_empty(*lead, 1),
    )


def _profiles_setup_context(ctx, inputs: tuple, output: tuple) -> None:
    z, d_rows, d_cols, var_scale, _, _ = inputs
    _, cols, e_rows, sig, inv, alpha = output
    ctx.save_for_backward(z, d_rows, d_cols, sig, inv, alpha, e_rows, cols)
    ctx.var_scale = var_scale


def _profiles_backward(ctx, grad_rows, grad_cols, *unused) -> tuple:
    z, d_rows, d_cols, sig, inv, alpha, e_rows, cols = ctx.saved_tensors
    grad_rows = torch.zeros_like(e_rows) if grad_rows is None else grad_rows
    grad_cols = torch.zeros_like(cols) if grad_cols is None else grad_cols
    grad_alpha = (grad_rows * e_rows).sum(-1, keepdim=True)
    # through exp and the floor: d/dx of exp(x) is the value itself, 0 where x was floored
    grad_x_rows = (grad_rows * e_rows * alpha).masked_fill_(d_rows * inv[..., 0:1] < _LOG_FLOOR, 0)
    grad_x_cols = (grad_cols * cols).masked_fill_(d_cols * inv[..., 1:2] < _LOG_FLOOR, 0)
    grad_inv = torch.cat(
        [(grad_x_rows * d_rows).sum(-1, keepdim=True), (grad_x_cols * d_cols).sum(-1, keepdim=True)], dim=-1
    )
    # inv = 1/(var + eps): d inv/d var = -inv²; var = scale·σ: d var/d z = scale·σ(1-σ)
    grad_z_var = -grad_inv * inv * inv * (ctx.var_scale * sig * (1 - sig))
    grad_z_alpha = grad_alpha * torch.sigmoid(z[..., 2:])
    return torch.cat([grad_z_var, grad_z_alpha], dim=-1), None, None, None, None, None


_gaussian_profiles.register_autograd(_profiles_backward, setup_context=_profiles_setup_context)


def _expand_coarse(profile: Tensor, grid: tuple[int, int]) -> Tensor:
    """Fast mode: profiles of the coarse (h/2 × w/2) queries over every second key row/column
    → the fine grid's queries and keys, by repetition."""
    B, H, _, n = profile.shape
    h, w = grid
    hc, wc = h // 2, w // 2
    fine_queries = profile.view(B, H, hc, 1, wc, 1, n).expand(B, H, hc, 2, wc, 2, n)
    return fine_queries.reshape(B, H, h * w, n).repeat_interleave(2, dim=-1)


class GaussianLocalityBias(nn.Module):
    """Predicts per-query Gaussian variance and amplitude and builds the attention bias.

    Parameter names match the public LocAtViT checkpoints: ``log_var`` (d_h → 2: row, column)
    and ``log_alpha`` (d_h → 1), shared across heads; 3·d_h + 3 parameters.

    Args:
        head_dim: per-head query size d_h.
        build_grid: patch grid ``(h, w)`` at the build resolution (fixes c, b, eps, clamp).
        fast_min_grid: in training, grids whose larger side is at least this (and both sides
            even) use the reference's fast mode: queries averaged over 2×2 patches, kernel
            evaluated on every second row/column and expanded by repetition. ``None``: never.
    """

    def __init__(
        self,
        head_dim: int,
        build_grid: tuple[int, int] = (14, 14),
        fast_min_grid: int | None = 32,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.log_var = nn.Linear(head_dim, 2, device=device, dtype=dtype)
        self.log_alpha = nn.Linear(head_dim, 1, device=device, dtype=dtype)
        self.fast_min_grid = fast_min_grid
        self.set_build_grid(build_grid)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """timm's ViT init: trunc-normal std 0.02 weights, zero bias (var ≈ 1, alpha ≈ ln 2)."""
        for linear in (self.log_var, self.log_alpha):
            trunc_normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)

    def set_build_grid(self, build_grid: tuple[int, int]) -> None:
        self.build_grid = (int(build_grid[0]), int(build_grid[1]))
        self.c, self.b, self.eps, self.clamp_min = gaug_constants(self.build_grid)

    def extra_repr(self) -> str:
        return f"build_grid={self.build_grid}, c={self.c:g}, eps={self.eps:g}, fast_min_grid={self.fast_min_grid}"

    def _patch_logits(self, q: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, float]:
        """``z [B, H, h·w, 3]`` (log-var row, log-var column, log-alpha) of the patch queries in
        fp32 (fp64 for fp64 queries), and the variance scale at this grid."""
        dtype = torch.promote_types(q.dtype, torch.float32)
        weight = torch.cat([self.log_var.weight, self.log_alpha.weight]).to(dtype)
        bias = torch.cat([self.log_var.bias, self.log_alpha.bias]).to(dtype)
        # all N queries through the d_h → 3 linear, then drop the prefix rows of the small
        # result: slicing q itself would cost a q-sized zero-fill in backward. The linear reads q
        # in timm's [B, N, H, d] qkv layout (1.5× faster than through the [B, H, N, d] view), and the
        # small z is made contiguous for the elementwise work of the profiles.
        z = (
            F.linear(q.to(dtype).transpose(1, 2), weight, bias)
            .transpose(1, 2)[:, :, q.shape[2] - grid[0] * grid[1] :]
            .contiguous()
        )
        var_scale = self.c * (min(grid) / min(self.build_grid) if grid != self.build_grid else 1.0)
        return z, var_scale

    def gaussian_parameters(self, q: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """What each patch query asks for (no fast mode): ``var [B, H, h·w, 2]`` (row, column, in
        squared patch units at this grid) and ``alpha [B, H, h·w]`` — the learned locality that
        reports show (σ = √var)."""
        with torch.autocast(q.device.type, enabled=False):
            z, var_scale = self._patch_logits(q, grid)
            return var_scale * torch.sigmoid(z[..., :2] - self.b), F.softplus(z[..., 2])

    def profiles(self, q: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column profiles of the patch queries: S[p, i·w + j] = rows[..., p, i] · cols[..., p, j].

        ``q``: all queries ``[B, H, N, d_h]`` (after q-norm), prefix tokens first, then the
        ``h·w`` patch tokens in row-major grid order. Returns ``rows [B, H, h·w, h]`` (alpha
        folded in) and ``cols [B, H, h·w, w]`` in fp32 (fp64 for fp64 queries), autocast or not.
        """
        if torch.jit.is_scripting():  # TorchScript: autocast needs a constant device there
            return self._profiles(q, grid)
        else:
            with torch.autocast(q.device.type, enabled=False):
                return self._profiles(q, grid)

    def _profiles(self, q: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        h, w = grid
        B, H, N, _ = q.shape
        z, var_scale = self._patch_logits(q, grid)
        # scripted or traced (torch.compile, export), the table is built in the graph: the cache
        # is Python state
        if torch.jit.is_scripting():
            d_rows, d_cols = build_distance_table(h, w, self.clamp_min, q.device)
        else:
            table = build_distance_table if torch.compiler.is_compiling() else distance_table
            d_rows, d_cols = table(h, w, self.clamp_min, q.device)
        fast = (
            self.training
            and self.fast_min_grid is not None
            and max(grid) >= self.fast_min_grid
            and h % 2 == 0
            and w % 2 == 0
        )
        if fast:
            # fast mode: average over 2×2 patches (of z: the linear commutes with the mean); coarse
            # query (i', j') sits on fine row 2i', column 2j', keys on every second row/column
            hc, wc = h // 2, w // 2
            z = z.reshape(B, H, hc, 2, wc, 2, 3).mean(dim=(3, 5)).reshape(B, H, hc * wc, 3)
            d_rows = d_rows.view(h, w, h)[0::2, 0::2, 0::2].reshape(hc * wc, hc)
            d_cols = d_cols.view(h, w, w)[0::2, 0::2, 0::2].reshape(hc * wc, wc)
        rows, cols = torch.ops.locatdino.gaussian_profiles(z, d_rows, d_cols, var_scale, self.b, self.eps)[:2]
        if fast:
            return _expand_coarse(rows, grid), _expand_coarse(cols, grid)
        return rows, cols

    def forward(self, q: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Additive attention bias ``[B, H, N, N]`` in ``q.dtype`` (the SDPA float mask).

        ``q``: all queries ``[B, H, N, d_h]`` (after q-norm), prefix tokens first. Rows and
        columns of prefix tokens are zero. (GAugAttention uses :meth:`profiles` directly.)
        """
        rows, cols = self.profiles(q, grid)
        return outer_product_mask(rows, cols, q.shape[2] - grid[0] * grid[1], q.dtype)
