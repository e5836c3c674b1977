"""Hugging Face transformers ``DINOv3ViTModel`` files (facebook/dinov3-*, docs/checkpoints.md) in DINOv3's
release layout, which :mod:`locatdino.models.checkpoints.dinov3` then converts like a release file.

``save_pretrained`` writes ``embeddings.{cls_token, mask_token, register_tokens, patch_embeddings}``,
``layer.{i}.{norm1, attention.{q,k,v,o}_proj, layer_scale1.lambda1, norm2, mlp.*, layer_scale2.lambda1}``
and ``norm`` (a model's in-memory state dict has ``model.layer.{i}``). q, k and v are separate and
join into the release's ``attn.qkv`` in that order, a k without bias (transformers' default) with a
zero one; the MLP is ``up_proj`` / ``down_proj`` (the release's ``fc1`` / ``fc2``) or, gated,
``gate_proj`` / ``up_proj`` / ``down_proj`` (SwiGLU ``w1`` / ``w2`` / ``w3``). The RoPE frequencies
are not stored: ``config.json``'s ``rope_theta`` says their base, refused unless it is timm's.
transformers is never imported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

MODEL_TYPE = "dinov3_vit"
_PATCH = "embeddings.patch_embeddings.weight"
_RULES = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.mask_token$", "mask_token"),
    (r"^embeddings\.register_tokens$", "storage_tokens"),
    (r"^embeddings\.patch_embeddings\.", "patch_embed.proj."),
    (r"^layer\.(\d+)\.(norm1|norm2)\.", r"blocks.\1.\2."),
    (r"^layer\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (r"^layer\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^norm\.", "norm."),
]
_MLP = {"up_proj": "fc1", "down_proj": "fc2"}
_GATED = {"gate_proj": "w1", "up_proj": "w2", "down_proj": "w3"}


def is_transformers_dinov3(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether a flat state dict is a transformers ``DINOv3ViTModel``."""
    return _PATCH in state_dict


def from_transformers_dinov3(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``DINOv3ViTModel``'s weights in the DINOv3 release's keys; unknown keys kept for the
    mismatch check to name."""
    flat = {re.sub(r"^model\.layer\.", "layer.", k): v for k, v in state_dict.items()}
    gated = any(".mlp.gate_proj." in k for k in flat)
    mlp = _GATED if gated else _MLP
    rules = [(re.compile(p), r) for p, r in _RULES]
    rules.append((re.compile(r"^layer\.(\d+)\.mlp\.(\w+)\."), lambda m: f"blocks.{m[1]}.mlp.{mlp.get(m[2], m[2])}."))
    out: dict[str, torch.Tensor] = {}
    for key, value in flat.items():
        if re.match(r"^layer\.\d+\.attention\.[qkv]_proj\.", key):
            continue  # joined below
        for pattern, replacement in rules:
            if pattern.search(key):
                key = pattern.sub(replacement, key)
                break
        out[key] = value
    blocks = sorted({int(m[1]) for k in flat if (m := re.match(r"^layer\.(\d+)\.attention\.q_proj\.weight$", k))})
    for i in blocks:
        part = f"layer.{i}.attention."
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([flat[f"{part}{n}_proj.weight"] for n in "qkv"])
        biases = {n: flat.get(f"{part}{n}_proj.bias") for n in "qkv"}
        present = [b for b in biases.values() if b is not None]
        if present:
            zero = torch.zeros_like(present[0])
            out[f"blocks.{i}.attn.qkv.bias"] = torch.cat([zero if b is None else b for b in biases.values()])
    return out


def dinov3_config_disagreement(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """What in a ``dinov3_vit`` ``config.json`` disagrees with the weights (in the transformers layout)
    or with timm's DINOv3 models (RoPE base 100, LayerNorm ε 1e-5), in words; None when nothing does
    or the config is another model's."""
    if config.get("model_type") != MODEL_TYPE or _PATCH not in state_dict:
        return None
    proj = state_dict[_PATCH]
    regs = state_dict.get("embeddings.register_tokens")
    found = {
        "hidden_size": (int(proj.shape[0]), "the weights are {} wide"),
        "patch_size": (int(proj.shape[-1]), "the weights' patch is {} px"),
        "num_register_tokens": (0 if regs is None else int(regs.shape[1]), "the weights have {} register tokens"),
        "rope_theta": (100.0, "timm's DINOv3 RoPE has base {:g}"),
        "layer_norm_eps": (1e-5, "timm's DINOv3 LayerNorm has ε {:g}"),
    }
    for key, (value, says) in found.items():
        expected = config.get(key)
        if expected is not None and expected != value:
            return f"{key} {expected} but {says.format(value)}"
    return None
