"""DINOv3 release files (``dinov3_vit{s,s+,b,l,h+,7b}16_pretrain_*.pth``, docs/checkpoints.md) in timm's keys.

A release is a flat state dict in DINOv3's own layout: ``cls_token``, ``storage_tokens`` ``[1, 4, D]``
(registers), ``mask_token`` (iBOT's, unused at inference), ``patch_embed.proj.*`` (patch 16),
``blocks.{i}.{norm1, attn.qkv, attn.proj, ls1.gamma, norm2, ls2.gamma}`` with ``mlp.fc1`` / ``fc2``
or SwiGLU ``mlp.w1`` / ``w2`` / ``w3``, ``norm.*`` and the RoPE periods ``rope_embed.periods``; no
absolute position embedding. Its ``storage_tokens`` name the layout, as timm's
``timm.models.eva.checkpoint_filter_fn`` tells it apart, and that filter does the renaming.

Three things the filter does not check are checked here first, each refused in one line, because
each would load without error and give other tokens than the official model:

- the q / v biases. ``attn.qkv.bias`` is used as ``bias * bias_mask`` (``bias_mask`` zeroes the k
  part); timm keeps q and v in ``*_dinov3_qkvb`` models and drops them, printing nothing useful,
  for the bias-free ``*_dinov3`` names. Non-zero q / v biases under a bias-free name are refused,
  naming the ``_qkvb`` model (measured on ViT-S/16: 9e-4 on patch tokens, 2e-2 on the class token
  otherwise); all-zero ones (the distilled releases) load into either. A non-zero k bias (a file
  trained without the mask) has no place in timm's model: refused too.
- the RoPE periods: the file's ``rope_embed.periods`` must be the model's (base 100 over
  ``head_dim / 4`` frequencies), which also says the head count the weights' shapes do not show.
- the architecture: width, depth, heads, MLP kind and storage-token count against the model's,
  before the keys are compared one by one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import timm
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3
from timm.models.eva import Eva
from timm.models.eva import checkpoint_filter_fn as eva_filter
from torch import nn

PERIODS = "rope_embed.periods"
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_QKV_BIAS = re.compile(r"^(blocks\.\d+\.attn\.qkv\.)bias$")
# timm's DINOv3 names by width (and MLP): what a file of that size is for
_SIZES = {(384, False): "small", (384, True): "small_plus", (768, False): "base", (1024, False): "large"}
_SIZES |= {(1280, True): "huge_plus", (4096, True): "7b"}
_SIZE_NAMES = {"small": "ViT-S/16", "small_plus": "ViT-S+/16", "base": "ViT-B/16", "large": "ViT-L/16"}
_SIZE_NAMES |= {"huge_plus": "ViT-H+/16", "7b": "ViT-7B/16"}


def is_dinov3_release(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether a flat state dict is in DINOv3's layout (its registers under DINOv3's name, or its RoPE periods)."""
    return "storage_tokens" in state_dict or PERIODS in state_dict


def is_dinov3_model(model: nn.Module) -> bool:
    """Whether ``model`` is timm's DINOv3 architecture (an ``Eva`` with DINOv3's RoPE)."""
    return isinstance(model, Eva) and isinstance(getattr(model, "rope", None), RotaryEmbeddingDinoV3)


def is_dinov3_name(name: str) -> bool:
    """Whether ``name`` is one of timm's vanilla DINOv3 models (``vit_*_patch16_dinov3[_qkvb]``)."""
    return re.fullmatch(r"vit_\w+_dinov3(_qkvb)?", timm.models.split_model_name_tag(name)[0]) is not None


@dataclass(frozen=True)
class DINOv3Weights:
    """What a DINOv3-layout state dict holds, read from its shapes."""

    width: int
    depth: int
    patch: int
    storage: int
    swiglu: bool
    heads: int | None  # from the RoPE periods (head_dim / 4 of them); None without them
    qv_bias: bool  # non-zero q or v biases

    def describe(self) -> str:
        """``"DINOv3 ViT-L/16 (1024 wide, 24 blocks, 16 heads)"``."""
        size = _SIZES.get((self.width, self.swiglu))
        known = _SIZE_NAMES.get(size, f"ViT /{self.patch}") if size else f"ViT /{self.patch}"
        heads = f", {self.heads} heads" if self.heads else ""
        return f"DINOv3 {known} ({self.width} wide, {self.depth} blocks{heads}{', SwiGLU' if self.swiglu else ''})"

    def timm_name(self) -> str | None:
        """timm's model for these weights (``_qkvb`` when they have q / v biases), None for a size timm has not."""
        size = _SIZES.get((self.width, self.swiglu))
        if size is None:
            return None
        base = f"vit_{size}_patch16_dinov3"
        return f"{base}_qkvb" if self.qv_bias and timm.is_model(f"{base}_qkvb") else base


def read_dinov3(state_dict: Mapping[str, torch.Tensor]) -> DINOv3Weights:
    """The architecture facts of a DINOv3-layout state dict (``ValueError`` without a patch embedding)."""
    proj = state_dict.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4:
        raise ValueError("a DINOv3-layout file without patch_embed.proj.weight [D, 3, p, p]")
    width = int(proj.shape[0])
    storage = state_dict.get("storage_tokens")
    periods = state_dict.get(PERIODS)
    biases = effective_qkv_biases(state_dict)
    return DINOv3Weights(
        width=width,
        depth=len({m.group(1) for k in state_dict if (m := _BLOCK.match(k))}),
        patch=int(proj.shape[-1]),
        storage=0 if storage is None else int(storage.shape[1]),
        swiglu="blocks.0.mlp.w1.weight" in state_dict,
        heads=width // (4 * periods.numel()) if periods is not None and periods.numel() else None,
        qv_bias=any(bool(b[:width].any() or b[2 * width :].any()) for b in biases.values()),
    )


def effective_qkv_biases(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"blocks.{i}.attn.qkv.bias": bias * bias_mask}``: the biases the official model adds (the
    mask, 1 on q and v and 0 on k in trained files, is optional); ``ValueError`` for a mask that
    holds NaN (its initial value: a model state that was never initialised)."""
    out = {}
    for key, bias in state_dict.items():
        match = _QKV_BIAS.match(key)
        if match is None:
            continue
        mask = state_dict.get(f"{match.group(1)}bias_mask")
        if mask is not None and not torch.isfinite(mask).all():
            raise ValueError(f"{match.group(1)}bias_mask holds NaN: the file is an uninitialised model state")
        out[key] = bias if mask is None else bias * mask.to(bias.dtype)
    return out


def check_dinov3_fits(weights: DINOv3Weights, state_dict: Mapping[str, torch.Tensor], model: nn.Module, name: str):
    """``ValueError`` in one line when DINOv3 weights cannot give the official tokens in ``model``
    (``name``): another architecture, other RoPE periods, q / v biases it has no place for."""
    hint = f": use {weights.timm_name()}" if weights.timm_name() else ""
    if not is_dinov3_model(model):
        raise ValueError(
            f"holds {weights.describe()} weights but {name} is a {type(model).__name__}, not DINOv3's{hint}"
        )
    attn = model.blocks[0].attn
    ours = (model.embed_dim, len(model.blocks), attn.num_heads, hasattr(model.blocks[0].mlp, "fc1_g"))
    heads = attn.num_heads if weights.heads is None else weights.heads
    if (weights.width, weights.depth, heads, weights.swiglu) != ours:
        mlp = ", SwiGLU" if ours[3] else ""
        raise ValueError(
            f"holds {weights.describe()} weights but {name} is {ours[0]} wide, {ours[1]} blocks, "
            f"{ours[2]} heads{mlp}{hint}"
        )
    registers = 0 if model.reg_token is None else int(model.reg_token.shape[1])
    if weights.storage != registers:
        raise ValueError(f"the file has {weights.storage} storage tokens but {name} has {registers}")
    periods = state_dict.get(PERIODS)
    if periods is not None and not torch.allclose(periods.float(), model.rope.periods.float(), rtol=1e-5):
        raise ValueError(
            f"{PERIODS} {[round(float(p), 4) for p in periods[:3]]}... differ from {name}'s RoPE "
            f"{[round(float(p), 4) for p in model.rope.periods[:3]]}... (base {model.rope.temperature:g})"
        )
    biases = effective_qkv_biases(state_dict)
    width = weights.width
    if any(bool(b[width : 2 * width].any()) for b in biases.values()):
        raise ValueError("has a non-zero k bias in attn.qkv.bias (no bias_mask zeroes it), which timm's model has not")
    if weights.qv_bias and attn.q_bias is None:
        better = weights.timm_name() or f"{timm.models.split_model_name_tag(name)[0]}_qkvb"
        raise ValueError(
            f"holds non-zero q / v biases (attn.qkv.bias) but {name} has none, so its tokens would differ "
            f"from DINOv3's: use {better}"
        )


def from_dinov3(state_dict: Mapping[str, torch.Tensor], model: nn.Module, name: str) -> dict[str, torch.Tensor]:
    """A DINOv3 release's weights in the keys of ``model`` (timm's DINOv3 ``name``), by timm's own
    ``eva.checkpoint_filter_fn`` after the checks of :func:`check_dinov3_fits` (one-line ``ValueError``)."""
    check_dinov3_fits(read_dinov3(state_dict), state_dict, model, name)
    flat = dict(state_dict)
    biases = effective_qkv_biases(flat)
    for key in biases:  # the masked bias, without its mask; none at all where the model has none (all zero)
        flat.pop(f"{key}_mask", None)
        if model.blocks[0].attn.q_bias is None:
            del flat[key]
        else:
            flat[key] = biases[key]
    return eva_filter(flat, model)
