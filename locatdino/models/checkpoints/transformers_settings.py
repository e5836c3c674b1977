"""The settings of a Hugging Face ``config.json`` that change what the weights compute, against the model.

A transformers ``ViTModel`` / ``Dinov2Model`` builds its activation, its q, k, v biases and its
LayerNorm ε from ``config.json`` (``hidden_act``, ``qkv_bias``, ``layer_norm_eps``); the weights'
shapes show none of them. The timm model the weights are loaded into has its own, fixed by its
name, so a config that says otherwise would run as another network without a word (a ReLU model as
GELU: tokens 1.46 away from transformers' own). :func:`unhonoured_setting` names the first such
setting, so the load is refused instead. transformers is never imported: each activation name it
knows is written here as the function it computes, and compared with the model's on a probe.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def _tanh_gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


# transformers' activation names (its ACT2FN) and what each computes; names not listed are refused
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_python": F.gelu,
    "gelu_new": _tanh_gelu,
    "gelu_fast": _tanh_gelu,
    "gelu_pytorch_tanh": _tanh_gelu,
    "gelu_python_tanh": _tanh_gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "swish": F.silu,
    "mish": F.mish,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "linear": lambda x: x,
}
# the tanh approximation is within 5e-4 of the exact GELU: a tolerance well below that tells them apart
_ACTIVATION_ATOL = 1e-5
# transformers' ViTModel configs of DINO say 1e-12 where the release trained with timm's 1e-6: an ε
# this close to the model's changes a LayerNorm of unit-variance inputs by < 1e-6 relative (docs/checkpoints.md)
_EPS_ATOL = 1e-6


def unhonoured_setting(config: Mapping[str, Any], model: nn.Module) -> str | None:
    """The first of ``config``'s ``hidden_act``, ``qkv_bias``, ``layer_norm_eps`` that ``model``
    (a timm ViT) does not compute, in words; None when it computes all that the config states."""
    block = model.blocks[0]
    act = getattr(getattr(block, "mlp", None), "act", None)
    # a SwiGLU MLP (Dinov2Model's use_swiglu_ffn) always computes SiLU: transformers ignores hidden_act
    if "hidden_act" in config and act is not None and not config.get("use_swiglu_ffn"):
        if (problem := _activation_problem(config["hidden_act"], act)) is not None:
            return problem
    qkv = getattr(getattr(block, "attn", None), "qkv", None)
    if "qkv_bias" in config and isinstance(qkv, nn.Linear) and bool(config["qkv_bias"]) != (qkv.bias is not None):
        has = "has" if qkv.bias is not None else "has no"
        return f"qkv_bias {json.dumps(config['qkv_bias'])} but the model's attention {has} q, k, v bias"
    eps = getattr(getattr(block, "norm1", None), "eps", None)
    wanted = config.get("layer_norm_eps")
    if isinstance(eps, float) and wanted is not None:
        if not isinstance(wanted, (int, float)) or abs(wanted - eps) > _EPS_ATOL:
            return f"layer_norm_eps {json.dumps(wanted)} but the model's LayerNorm ε is {eps:g}"
    return None


def _activation_problem(name: object, act: nn.Module) -> str | None:
    """Why ``act`` is not transformers' ``name``, or None when it computes the same function."""
    reference = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if reference is None:
        return f"hidden_act {json.dumps(name)} is not an activation locatdino knows ({', '.join(ACTIVATIONS)})"
    probe = torch.linspace(-6.0, 6.0, 241)
    with torch.no_grad():
        computed = act(probe)
    if torch.allclose(computed, reference(probe), rtol=0, atol=_ACTIVATION_ATOL):
        return None
    same = [n for n, f in ACTIVATIONS.items() if torch.allclose(computed, f(probe), rtol=0, atol=_ACTIVATION_ATOL)]
    what = same[0] if same else type(act).__name__
    return f"hidden_act {json.dumps(name)} but the model's MLP computes {what} (pass a model with that activation)"
