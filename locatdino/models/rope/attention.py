"""GAug on RoPE attention: timm's ``EvaAttention`` (DINOv3, EVA-02, ``vit_*_rope_*``) and
``AttentionRope`` (the mixed-RoPE ViTs, ``locatvit_*_rope_mixed``) with the Gaussian locality bias.

Where the bias is computed matters: as the official ``GaussianAugmentedAttentionRope`` does, S comes
from the patch queries *after* q-norm and *before* the rotary embedding. The rotation encodes a
token's position in its query; GAug predicts a width and an amplitude from what the query asks
for, and its kernel is centred on the token's grid position anyway. S is then added to the
logits of the rotated q and k (the official code adds it to the attention mask), prefix tokens
(class token, registers) unrotated and unbiased. Everything else is timm's forward: q / v biases
(``q_bias``, ``v_bias``, and DINOv3's non-persistent zero ``k_bias``), separate or fused
projections, grouped key / value heads, the inner norm, gating, dropout.

The layers are made in place from timm's (:func:`add_gaug_to_blocks`), keeping every weight; the bias is
added by :class:`~locatdino.models.gaug.attention.GAugKernels`' paths (fused CPU kernel,
FlexAttention on CUDA, a materialised mask only where those cannot serve), so a RoPE LocAt model
trains without an ``N × N`` bias tensor exactly as a LocAtViT does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import AttentionRope, apply_rot_embed_cat, register_notrace_module
from timm.models.eva import Eva, EvaAttention
from torch import nn

from locatdino.models.gaug.attention import GAugKernels
from locatdino.models.gaug.locality_bias import GaussianLocalityBias
from locatdino.models.gaug.patch_grid import PatchGrid, install_patch_grid


class _GAugRope(GAugKernels):
    """The forward both RoPE layers share; each class supplies :meth:`project` (its q, k, v)."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        B, N, _ = x.shape
        grid = self._grid(N)
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self.project(x)
        q, k = self.q_norm(q), self.k_norm(k)
        rows, cols = self.gaug.profiles(q, grid)  # before the rotation, as the official layer
        if rope is not None:
            npt, half = self.num_prefix_tokens, self.rotate_half
            q = torch.cat([q[:, :, :npt], apply_rot_embed_cat(q[:, :, npt:], rope, half=half)], dim=2).type_as(v)
            k = torch.cat([k[:, :, :npt], apply_rot_embed_cat(k[:, :, npt:], rope, half=half)], dim=2).type_as(v)
        if self.num_kv_groups > 1:  # grouped key / value heads, expanded after the rotation as timm does
            k, v = k.repeat_interleave(self.num_kv_groups, dim=1), v.repeat_interleave(self.num_kv_groups, dim=1)
        x = self.biased_attention(q, k, v, rows, cols, N - grid[0] * grid[1], attn_mask, is_causal)
        x = self.norm(x.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


@register_notrace_module  # FX: a leaf, as GAugAttention
class GAugEvaAttention(_GAugRope, EvaAttention):
    """timm's ``EvaAttention`` (DINOv3, EVA-02, ``vit_*_rope_*``) with GAug; made by :func:`add_gaug`."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, _ = x.shape
        if self.qkv is None:
            q = self.q_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
            k = self.k_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
            v = self.v_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
            return q, k, v
        if self.q_bias is None:
            qkv = self.qkv(x)
        elif self.qkv_bias_separate:
            qkv = self.qkv(x) + torch.cat((self.q_bias, self.k_bias, self.v_bias))
        else:
            qkv = F.linear(x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias)))
        q, k, v = qkv.reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v


@register_notrace_module
class GAugAttentionRope(_GAugRope, AttentionRope):
    """timm's ``AttentionRope`` (the mixed-RoPE ViTs) with GAug: the official
    ``GaussianAugmentedAttentionRope``'s equations; made by :func:`add_gaug`."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, _ = x.shape
        if self.qkv is not None:
            q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, v
        q = self.q_proj(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v


_GAUG_CLASS = {EvaAttention: GAugEvaAttention, AttentionRope: GAugAttentionRope}


def add_gaug_to_blocks(model: Eva) -> None:
    """GAug in every block of a timm ``Eva`` (in place), wired to the model's patch grid; the GAug
    constants follow the model's build grid ``model.patch_embed.grid_size``."""
    patch_grid = install_patch_grid(model)
    build_grid = tuple(model.patch_embed.grid_size)
    for i, block in enumerate(model.blocks):
        try:
            add_gaug(block.attn, build_grid, patch_grid)
        except TypeError as err:
            raise TypeError(f"blocks.{i}.attn: {err}") from None


def add_gaug(attn: nn.Module, build_grid: tuple[int, int], patch_grid: PatchGrid) -> nn.Module:
    """Turn a timm ``EvaAttention`` / ``AttentionRope`` into its GAug version in place (every weight
    and option kept, GAug's two linears initialised on the device and dtype of the layer's
    projection), or rewire one that already is; GAug's constants follow ``build_grid``."""
    if not isinstance(attn, _GAugRope):
        gaug_class = _GAUG_CLASS.get(type(attn))
        if gaug_class is None:
            raise TypeError(
                f"GAug extends timm's EvaAttention and AttentionRope on RoPE ViTs, got {type(attn).__name__}"
            )
        weight = attn.proj.weight
        attn.__class__ = gaug_class
        attn.gaug = GaussianLocalityBias(attn.head_dim, device=weight.device, dtype=weight.dtype)
        if not hasattr(attn, "num_kv_groups"):  # EvaAttention: no grouped key / value heads
            attn.num_kv_groups = 1
    attn.gaug.set_build_grid(build_grid)
    attn.patch_grid = patch_grid
    return attn
