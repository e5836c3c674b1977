"""GAug attention: timm's ``Attention`` plus the Gaussian locality bias (docs/locatvit.md).

A drop-in ``attn_layer`` for timm's ``VisionTransformer``: same constructor and
``forward(x, attn_mask=None, is_causal=False)`` contract as ``timm.layers.Attention``, same
parameter names, plus ``gaug.log_var`` / ``gaug.log_alpha``. The patch grid comes from the
model's :class:`~locatdino.models.gaug.patch_grid.PatchGrid` (see there for why), attached by
:func:`~locatdino.models.locatify.locatify` or the ``locatvit_*`` registry entries. How the bias is
added (the kernels and the choice among them) is :class:`GAugKernels`, which the RoPE attentions of
:mod:`locatdino.models.rope` share.
"""

import os
import warnings

import torch
import torch.nn.functional as F
from timm.layers import Attention, register_notrace_module
from timm.layers.attention import resolve_self_attn_mask

from locatdino.models.gaug.bias_mask import outer_product_mask
from locatdino.models.gaug.flex_bias_attention import FlexAttentionUnavailable, flex_bias_attention, flex_failure
from locatdino.models.gaug.locality_bias import GaussianLocalityBias
from locatdino.models.gaug.patch_grid import PatchGrid
from locatdino.models.gaug.separable_bias_attention import mask_fits_one_chunk, separable_bias_attention

PATHS = ("auto", "separable", "flex", "mask")


class GAugKernels:
    """How a GAug attention layer adds the bias and attends, shared by every attention class GAug
    extends (timm's ``Attention`` here, the RoPE attentions in :mod:`locatdino.models.rope`).

    ``softmax(q kᵀ / √d_h + S) v`` with S from :class:`GaussianLocalityBias`, computed by one of
    three paths that give the same result (``gaug_path``; ``"auto"`` picks per call):

    - ``"separable"`` (auto on CPU): :func:`separable_bias_attention`, fused SDPA over chunks of
      mask rows with its own backward;
    - ``"flex"`` (auto on CUDA): :func:`flex_bias_attention`, the bias added inside a compiled
      FlexAttention kernel from the two profiles, no ``N × N`` tensor;
    - ``"mask"``: one differentiable ``[B, H, N, N]`` float mask for SDPA. Auto takes it for
      attention dropout, extra masks, timm's unfused mode and devices other than CPU and CUDA.

    On CUDA where FlexAttention is not used (head sizes under 16, below its GPU kernel tiles; for
    the rest of the process once every kernel option failed to compile or run, one warning with
    the errors; a forced ``"flex"`` raises instead), auto takes ``"separable"`` where the whole
    mask would exceed one of its chunks (large inputs: no ``N × N`` tensor) and ``"mask"`` where
    it would not (:func:`mask_fits_one_chunk`).

    The default comes from the environment variable ``LOCATDINO_GAUG_PATH`` (``auto`` when
    unset): ``LOCATDINO_GAUG_PATH=mask locatdino fit ...`` keeps a run off FlexAttention where
    ``torch.compile`` cannot build its kernels. A subclass or layer may set its own.

    The host class provides timm's attention attributes: ``head_dim``, ``scale``, ``fused_attn``,
    ``attn_drop``, ``training``, and ``patch_grid`` (the model's :class:`PatchGrid`).
    """

    gaug_path: str = os.environ.get("LOCATDINO_GAUG_PATH", "auto")

    def _grid(self, seq_len: int) -> tuple[int, int]:
        """The patch grid of this call's ``seq_len`` tokens (a clear error when the layer is not wired)."""
        if self.patch_grid is None:
            raise RuntimeError(
                "GAug attention does not know the patch grid: build the model with "
                "timm.create_model('locatvit_*') or pass it through locatdino.models.locatify(model)"
            )
        return self.patch_grid.lookup(seq_len)

    def _resolve_path(self, device: torch.device, plain: bool) -> str:
        """The path of this call; ``plain``: no attention dropout, extra mask or causal flag."""
        if self.gaug_path not in PATHS:
            raise ValueError(
                f"GAugAttention.gaug_path (LOCATDINO_GAUG_PATH) must be one of {PATHS}, got '{self.gaug_path}'"
            )
        if self.gaug_path != "auto":
            if self.gaug_path != "mask" and not plain:
                raise ValueError(f"GAug path '{self.gaug_path}' has no attention dropout or extra mask: use 'mask'")
            return self.gaug_path
        if not (plain and self.fused_attn):
            return "mask"
        if device.type == "cpu":
            return "separable"
        if device.type != "cuda":
            return "mask"
        return "flex" if self.head_dim >= 16 and flex_failure() is None else "by size"

    def _path(self, device: torch.device, plain: bool) -> str:
        if torch.jit.is_scripting():  # TorchScript: no FlexAttention, no class-wide choice
            return "separable" if plain and self.fused_attn and device.type == "cpu" else "mask"
        else:
            return self._resolve_path(device, plain)

    @torch.jit.unused  # TorchScript never takes the flex path (nor parses try/except)
    def _flex(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, num_prefix: int
    ) -> tuple[torch.Tensor, str]:
        """``(FlexAttention's output, "flex")``, or ``(q, "by size")`` when it is unavailable (auto path)."""
        try:
            return flex_bias_attention(q, k, v, rows, cols, num_prefix, self.scale), "flex"
        except FlexAttentionUnavailable as err:
            if self.gaug_path != "auto":
                raise
            warnings.warn(f"GAug uses SDPA with the bias (chunked at large inputs) from now on: {err}", stacklevel=3)
            return q, "by size"

    @torch.jit.unused  # TorchScript never resolves "by size" (see _path)
    def _by_size(self, q: torch.Tensor) -> str:
        return "mask" if mask_fits_one_chunk(q) else "separable"

    def biased_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        num_prefix: int,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """``softmax(q kᵀ · scale + S [+ attn_mask]) v`` ``[B, H, N, d]`` for the bias ``S`` of the
        profiles ``rows`` / ``cols`` (:meth:`GaussianLocalityBias.profiles`) on the patch block, by
        this call's path."""
        N = q.shape[2]
        dropout_p = self.attn_drop.p if self.training else 0.0
        path = self._path(q.device, dropout_p == 0.0 and attn_mask is None and not is_causal)
        if path == "flex":
            x, path = self._flex(q, k, v, rows, cols, num_prefix)
            if path == "flex":
                return x
        if path == "by size":  # CUDA without FlexAttention: no N × N tensor at large inputs
            path = self._by_size(q)
        if path == "separable":
            return separable_bias_attention(q, k, v, rows, cols, num_prefix, self.scale)
        # "mask": attention dropout, extra masks, timm's unfused mode, small inputs without flex
        bias = outer_product_mask(rows, cols, num_prefix, q.dtype)
        extra = resolve_self_attn_mask(N, bias, attn_mask, is_causal)
        if extra is not None:
            bias = bias + extra
        if self.fused_attn:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        attn = (q * self.scale) @ k.transpose(-2, -1) + bias
        return self.attn_drop(attn.softmax(dim=-1)) @ v


@register_notrace_module  # FX: a leaf (its grid lookup and kernels are Python, not traceable)
class GAugAttention(GAugKernels, Attention):
    """Multi-head self-attention with a learned, query-dependent Gaussian locality bias: timm's
    ``Attention`` with S from the queries after q-norm, added by :class:`GAugKernels`' paths."""

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.gaug = GaussianLocalityBias(self.head_dim, device=device, dtype=dtype)
        self.patch_grid: PatchGrid | None = None

    @classmethod
    def from_attention(cls, attn: Attention) -> "GAugAttention":
        """Turn a timm ``Attention`` into a ``GAugAttention`` in place, keeping every weight and
        option (qk-norm, gating, dropout, fused flag); the new GAug parameters get the default
        initialisation on the device and dtype of ``attn.qkv``."""
        if type(attn) is not Attention:
            raise TypeError(f"GAug can only extend timm.layers.Attention, got {type(attn).__name__}")
        weight = attn.qkv.weight
        attn.__class__ = cls
        attn.gaug = GaussianLocalityBias(attn.head_dim, device=weight.device, dtype=weight.dtype)
        attn.patch_grid = None
        return attn

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        B, N, _ = x.shape
        grid = self._grid(N)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        rows, cols = self.gaug.profiles(q, grid)
        x = self.biased_attention(q, k, v, rows, cols, N - grid[0] * grid[1], attn_mask, is_causal)
        x = self.norm(x.transpose(1, 2).reshape(B, N, self.attn_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))
