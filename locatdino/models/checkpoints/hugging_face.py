"""Hugging Face transformers files (docs/checkpoints.md): a ``Dinov2Model`` (facebook/dinov2-*, with or
without registers) or ``ViTModel`` (facebook/dino-vit*) saved by ``save_pretrained``, in timm's keys.

The weights are ``model.safetensors`` or ``pytorch_model.bin``, alone or in their repository folder
beside ``config.json``; a folder may be given as the checkpoint. Both layouts keep q, k and v apart
(``attention.attention.{query,key,value}``), concatenated here into timm's ``qkv`` in that order. A
``Dinov2Model`` is first renamed to the DINOv2 release's own keys and then goes through the same
conversion as a release file (:mod:`locatdino.models.checkpoints.dinov2`), so both get the same
timm model and the same position-embedding rule; a ``ViTModel`` maps straight onto timm's ViT. The
``config.json`` is read only to refuse one that disagrees with the weights or with the model
(its head count cannot be seen in the weights' shapes). transformers is never imported.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_PATCH = "embeddings.patch_embeddings.projection.weight"
_TASK_PREFIXES = ("dinov2.", "vit.")  # a classification model's backbone, e.g. Dinov2ForImageClassification

# (pattern, replacement) in order; the q, k, v entries are merged afterwards
_SHARED = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.mask_token$", "mask_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^layernorm\.", "norm."),
]
_DINOV2 = _SHARED + [  # onto the DINOv2 release's keys
    (r"^embeddings\.register_tokens$", "register_tokens"),
    (r"^encoder\.layer\.(\d+)\.(norm1|norm2)\.", r"blocks.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^encoder\.layer\.(\d+)\.mlp\.(fc1|fc2)\.", r"blocks.\1.mlp.\2."),
    (r"^encoder\.layer\.(\d+)\.mlp\.weights_in\.", r"blocks.\1.mlp.w12."),
    (r"^encoder\.layer\.(\d+)\.mlp\.weights_out\.", r"blocks.\1.mlp.w3."),
]
_VIT = _SHARED + [  # onto timm's ViT keys
    (r"^encoder\.layer\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"blocks.\1.mlp.fc2."),
]


def weights_in_folder(folder: str) -> str:
    """The weights file of a Hugging Face model folder (``model.safetensors``, else
    ``pytorch_model.bin``); a one-line ``ValueError`` naming the folder when it holds neither."""
    for name in WEIGHT_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    sharded = [n for n in os.listdir(folder) if n.endswith(".index.json")]
    if sharded:
        raise ValueError(
            f"{folder}: holds a sharded checkpoint ({sharded[0]}), which is not read: save it as one model.safetensors"
        )
    raise ValueError(
        f"{folder}: is a folder without {' or '.join(WEIGHT_FILES)} (a Hugging Face model folder holds "
        "one; a sharded FSDP checkpoint? save it as one file)"
    )


def is_transformers_layout(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether a flat state dict is a transformers ``Dinov2Model`` / ``ViTModel`` (or a task model around one)."""
    return any(f"{prefix}{_PATCH}" in state_dict for prefix in ("", *_TASK_PREFIXES))


def from_transformers(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``Dinov2Model``'s weights in the DINOv2 release's keys, a ``ViTModel``'s in timm's; what is not
    backbone (the ViT's pooler and mask token, a task model's classifier) dropped. Unknown keys are
    kept as they are, for the mismatch check to name."""
    state_dict = _backbone_keys(state_dict)
    vit = any(".layernorm_before." in k for k in state_dict)
    rules = [(re.compile(p), r) for p, r in (_VIT if vit else _DINOV2)]
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.startswith("pooler.") or (vit and key == "embeddings.mask_token"):  # not backbone
            continue
        for pattern, replacement in rules:
            if pattern.search(key):
                key = pattern.sub(replacement, key)
                break
        renamed[key] = value
    return _merge_qkv(renamed)


def _backbone_keys(state_dict: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """A task model's backbone keys without their prefix (``dinov2.``, ``vit.``); a base model's as they are."""
    for prefix in _TASK_PREFIXES:
        if f"{prefix}{_PATCH}" in state_dict:
            return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    return state_dict


def _merge_qkv(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' separate ``query``, ``key``, ``value`` of each block as timm's one ``qkv`` (rows q, k, v)."""
    out = {}
    for key, value in state_dict.items():
        match = re.match(r"^(blocks\.\d+\.attn\.)(query|key|value)\.(weight|bias)$", key)
        if match is None:
            out[key] = value
        elif match.group(2) == "query":
            parts = [state_dict.get(f"{match.group(1)}{name}.{match.group(3)}") for name in ("query", "key", "value")]
            if any(p is None for p in parts):
                raise ValueError(f"{match.group(1)}: the file has query but not key and value")
            out[f"{match.group(1)}qkv.{match.group(3)}"] = torch.cat(parts)
    return out


def transformers_config(source: str) -> tuple[str, dict[str, Any]] | None:
    """``(path, contents)`` of the transformers ``config.json`` that describes ``source`` (a model
    folder, or its ``model.safetensors`` / ``pytorch_model.bin``); None when there is none, or it
    is not a transformers config (timm's has no ``model_type``)."""
    folder = (
        source
        if os.path.isdir(source)
        else (os.path.dirname(source) if os.path.basename(source) in WEIGHT_FILES else None)
    )
    path = None if folder is None else os.path.join(folder, "config.json")
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: is not a readable JSON file ({err})") from err
    return (path, config) if isinstance(config, dict) and "model_type" in config else None


def config_disagreement(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """What in a transformers ``config`` disagrees with the weights (``state_dict`` in the transformers
    layout), in words; None when they agree or the weights are not in that layout."""
    state_dict = _backbone_keys(state_dict)
    proj = state_dict.get(_PATCH)
    if proj is None or proj.ndim != 4:
        return None
    dinov2 = not any(".layernorm_before." in k for k in state_dict)
    model_type = str(config["model_type"])
    if model_type not in (("dinov2", "dinov2_with_registers") if dinov2 else ("vit",)):
        return f"model_type {model_type!r} but the weights are a {'Dinov2Model' if dinov2 else 'ViTModel'}"
    width, patch = int(proj.shape[0]), int(proj.shape[-1])
    pos = state_dict.get("embeddings.position_embeddings")
    regs = state_dict.get("embeddings.register_tokens")
    fc1 = state_dict.get("encoder.layer.0.intermediate.dense.weight")
    found: dict[str, tuple[Any, str]] = {
        "hidden_size": (width, "the weights are {} wide"),
        "num_hidden_layers": (
            len({k.split(".")[2] for k in state_dict if k.startswith("encoder.layer.")}),
            "the weights have {} layers",
        ),
        "patch_size": (patch, "the weights' patch is {} px"),
        "image_size": (
            None if pos is None else math.isqrt(pos.shape[1] - 1) * patch,
            "the weights' position embeddings are for {} px",
        ),
        "intermediate_size": (None if fc1 is None else int(fc1.shape[0]), "the weights' MLP is {} wide"),
    }
    if dinov2:
        swiglu = any(".mlp.weights_in." in k for k in state_dict)
        found["num_register_tokens"] = (
            0 if regs is None else int(regs.shape[1]),
            "the weights have {} register tokens",
        )
        found["use_swiglu_ffn"] = (swiglu, f"the weights' MLP is {'SwiGLU' if swiglu else 'fc1/fc2'}")
    for key, (value, says) in found.items():
        expected = config.get(key, {"num_register_tokens": 0, "use_swiglu_ffn": False}.get(key))
        if expected is not None and value is not None and expected != value:
            return f"{key} {json.dumps(expected)} but {says.format(value)}"
    return None


def heads_disagreement(config: Mapping[str, Any], model: nn.Module) -> str | None:
    """The one thing of a config the weights cannot show: its head count, against ``model``'s."""
    heads = getattr(getattr(model.blocks[0], "attn", None), "num_heads", None)
    expected = config.get("num_attention_heads")
    if heads is not None and expected is not None and heads != expected:
        return f"num_attention_heads {expected} but the model has {heads} heads (pass a model of that geometry)"
    return None
