"""A written-out DINOv3 ViT forward (``forward_features``: ``x_norm_clstoken``, ``x_norm_patchtokens``) and
random weights in the release files' published layout, for checking what the loader builds.

Written from DINOv3's description (SPEC §2.1), independent of timm and of the package: patch
convolution; class token, then the storage tokens, then the patches (no position embedding);
pre-norm blocks whose attention rotates the q and k of the patch tokens (not of the prefix tokens)
by RoPE — base 100, head_dim / 4 periods per axis, patch-centre coordinates normalised per axis to
[-1, 1], angle 2π·coordinate / period, the (y, x) angles laid side by side and the whole repeated
twice, rotation by halves — with the qkv bias multiplied by its ``bias_mask``; LayerScale; GELU or
SwiGLU MLP; final LayerNorm (ε 1e-5).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PATCH = 16
BASE = 100.0


def swiglu_hidden(width: int, ratio: float) -> int:
    """DINOv3's SwiGLU hidden size: 2/3 of ratio × width, rounded up to a multiple of 8."""
    d = int(width * ratio * 2 / 3)
    return d + (-d % 8)


def release_weights(
    width: int,
    depth: int,
    heads: int,
    storage: int = 4,
    swiglu: bool = False,
    ratio: float = 4.0,
    qv_bias: bool = True,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random weights under the release's keys: ``cls_token``, ``storage_tokens``, ``mask_token``,
    ``patch_embed.proj``, ``blocks.{i}`` (``attn.qkv`` with a random bias, its k part made harmless
    by ``bias_mask`` 1-0-1 — zero q / v biases with ``qv_bias=False`` —, ``ls1`` / ``ls2.gamma``,
    ``mlp.fc1`` / ``fc2`` or SwiGLU ``mlp.w1`` / ``w2`` / ``w3``), ``norm``, ``rope_embed.periods``."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        return offset + scale * torch.randn(*shape, generator=g)

    w: dict[str, torch.Tensor] = {}

    def linear(name: str, out_features: int, in_features: int) -> None:
        w[f"{name}.weight"] = rand(out_features, in_features, scale=in_features**-0.5)
        w[f"{name}.bias"] = rand(out_features, scale=0.1)

    def norm(name: str) -> None:
        w[f"{name}.weight"], w[f"{name}.bias"] = rand(width, scale=0.2, offset=1.0), rand(width, scale=0.1)

    head_dim = width // heads
    w.update(
        {
            "cls_token": rand(1, 1, width),
            "storage_tokens": rand(1, storage, width),
            "mask_token": torch.zeros(1, width),
            "patch_embed.proj.weight": rand(width, 3, PATCH, PATCH, scale=0.05),
            "patch_embed.proj.bias": rand(width, scale=0.1),
            "rope_embed.periods": BASE ** (2 * torch.arange(head_dim // 4) / (head_dim // 2)),
        }
    )
    norm("norm")
    mask = torch.cat([torch.ones(width), torch.zeros(width), torch.ones(width)])
    for i in range(depth):
        p = f"blocks.{i}."
        norm(p + "norm1")
        linear(p + "attn.qkv", 3 * width, width)
        w[p + "attn.qkv.bias"] = w[p + "attn.qkv.bias"] * (1.0 if qv_bias else 1 - mask) * 3  # k part: masked
        w[p + "attn.qkv.bias_mask"] = mask.clone()
        linear(p + "attn.proj", width, width)
        norm(p + "norm2")
        w[p + "ls1.gamma"], w[p + "ls2.gamma"] = rand(width, scale=0.3, offset=0.5), rand(width, scale=0.3, offset=0.5)
        if swiglu:
            hidden = swiglu_hidden(width, ratio)
            linear(p + "mlp.w1", hidden, width)
            linear(p + "mlp.w2", hidden, width)
            linear(p + "mlp.w3", width, hidden)
        else:
            linear(p + "mlp.fc1", int(ratio * width), width)
            linear(p + "mlp.fc2", width, int(ratio * width))
    return w


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def rope_sin_cos(h: int, w: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)`` ``[h·w, head_dim]`` of DINOv3's RoPE on an ``h × w`` patch grid."""
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) / h * 2 - 1
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) / w * 2 - 1
    coords = torch.stack([ys[:, None].expand(h, w), xs[None, :].expand(h, w)], dim=-1).reshape(-1, 2)
    periods = BASE ** (2 * torch.arange(head_dim // 4, dtype=torch.float64) / (head_dim // 2))
    angles = (2 * math.pi * coords[:, :, None] / periods).reshape(h * w, head_dim // 2)  # y angles, then x
    angles = torch.cat([angles, angles], dim=-1)
    return angles.sin().float(), angles.cos().float()


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def dinov3_forward(w: dict[str, torch.Tensor], images: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_norm_clstoken [B, D], x_norm_patchtokens [B, h·w, D])`` of the release weights ``w``."""
    x = F.conv2d(images, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=PATCH)
    batch, width, h, wd = x.shape
    storage = w["storage_tokens"]
    prefix = 1 + storage.shape[1]
    x = torch.cat(
        [w["cls_token"].expand(batch, -1, -1), storage.expand(batch, -1, -1), x.flatten(2).transpose(1, 2)], 1
    )
    head_dim = width // heads
    sin, cos = rope_sin_cos(h, wd, head_dim)
    depth = len({k for k in w if k.endswith("norm1.weight")})
    for i in range(depth):
        p = f"blocks.{i}."
        y = _layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"])
        bias = w[p + "attn.qkv.bias"] * w.get(p + "attn.qkv.bias_mask", 1.0)
        qkv = (y @ w[p + "attn.qkv.weight"].T + bias).reshape(batch, -1, 3, heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q = torch.cat([q[:, :, :prefix], _rotate(q[:, :, prefix:], sin, cos)], dim=2)
        k = torch.cat([k[:, :, :prefix], _rotate(k[:, :, prefix:], sin, cos)], dim=2)
        attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(batch, -1, width)
        x = x + w[p + "ls1.gamma"] * (y @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"])
        y = _layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"])
        if p + "mlp.w1.weight" in w:
            a = y @ w[p + "mlp.w1.weight"].T + w[p + "mlp.w1.bias"]
            b = y @ w[p + "mlp.w2.weight"].T + w[p + "mlp.w2.bias"]
            y = (F.silu(a) * b) @ w[p + "mlp.w3.weight"].T + w[p + "mlp.w3.bias"]
        else:
            y = F.gelu(y @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"])
            y = y @ w[p + "mlp.fc2.weight"].T + w[p + "mlp.fc2.bias"]
        x = x + w[p + "ls2.gamma"] * y
    x = _layer_norm(x, w["norm.weight"], w["norm.bias"])
    return x[:, 0], x[:, prefix:]
