"""A written-out DINOv2 ViT forward (``forward_features``: ``x_norm_clstoken``, ``x_norm_patchtokens``) and
random weights in the release files' published layout, for checking what the loader builds.

Written from DINOv2's description (SPEC §2.1), independent of timm and of the package: patch
convolution, class token, position embeddings (the patch part resampled by the release's rule:
scale factor (g + 0.1)/√N without antialiasing for the plain models, the exact size with
antialiasing for the register models), registers inserted after the class token, pre-norm blocks
with layer scale, GELU or SwiGLU MLP, final LayerNorm (ε 1e-6).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PATCH = 14
GRID = 37  # the releases' position embeddings: 518 px / 14


def release_weights(
    width: int, depth: int, registers: int = 0, swiglu: bool = False, chunks: int = 0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random weights under the release's keys: ``cls_token``, ``pos_embed`` (37 × 37 + 1), ``mask_token``,
    ``register_tokens``, ``blocks.{i}`` (or ``blocks.{chunk}.{i}`` with ``chunks``) with ``ls1`` /
    ``ls2.gamma`` and ``mlp.fc1`` / ``fc2`` or SwiGLU ``mlp.w12`` / ``w3``, ``norm``."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        return offset + scale * torch.randn(*shape, generator=g)

    w: dict[str, torch.Tensor] = {}

    def linear(name: str, out_features: int, in_features: int) -> None:
        w[f"{name}.weight"] = rand(out_features, in_features, scale=in_features**-0.5)
        w[f"{name}.bias"] = rand(out_features, scale=0.1)

    def norm(name: str) -> None:
        w[f"{name}.weight"], w[f"{name}.bias"] = rand(width, scale=0.2, offset=1.0), rand(width, scale=0.1)

    w.update(
        {
            "cls_token": rand(1, 1, width),
            "pos_embed": rand(1, GRID * GRID + 1, width, scale=0.5),
            "mask_token": torch.zeros(1, width),
            "patch_embed.proj.weight": rand(width, 3, PATCH, PATCH, scale=0.05),
            "patch_embed.proj.bias": rand(width, scale=0.1),
        }
    )
    norm("norm")
    if registers:
        w["register_tokens"] = rand(1, registers, width)
    per_chunk = math.ceil(depth / chunks) if chunks else depth
    for i in range(depth):
        p = f"blocks.{i // per_chunk}.{i}." if chunks else f"blocks.{i}."
        norm(p + "norm1")
        linear(p + "attn.qkv", 3 * width, width)
        linear(p + "attn.proj", width, width)
        norm(p + "norm2")
        w[p + "ls1.gamma"], w[p + "ls2.gamma"] = rand(width, scale=0.3, offset=0.5), rand(width, scale=0.3, offset=0.5)
        if swiglu:
            linear(p + "mlp.w12", 2 * swiglu_hidden(width), width)
            linear(p + "mlp.w3", width, swiglu_hidden(width))
        else:
            linear(p + "mlp.fc1", 4 * width, width)
            linear(p + "mlp.fc2", width, 4 * width)
    return w


def swiglu_hidden(width: int) -> int:
    """DINOv2's SwiGLU hidden size for an MLP ratio of 4: 2/3 of 4 × width, rounded up to a multiple of 8."""
    return (int(4 * width * 2 / 3) + 7) // 8 * 8


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _block_key(w: dict[str, torch.Tensor], i: int) -> str:
    """``blocks.{i}.`` or, in a chunked file, ``blocks.{chunk}.{i}.``."""
    plain = f"blocks.{i}."
    if plain + "norm1.weight" in w:
        return plain
    return next(k[: -len("norm1.weight")] for k in w if k.endswith(f".{i}.norm1.weight") and k.count(".") == 4)


def dinov2_forward(
    w: dict[str, torch.Tensor], images: torch.Tensor, heads: int, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_norm_clstoken [B, D], x_norm_patchtokens [B, h·w, D])`` of the release weights ``w``."""
    x = F.conv2d(images, w["patch_embed.proj.weight"], w["patch_embed.proj.bias"], stride=PATCH)
    batch, width, h, wd = x.shape
    x = torch.cat([w["cls_token"].expand(batch, -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    pos = w["pos_embed"]
    side = math.isqrt(pos.shape[1] - 1)
    grid = pos[:, 1:].reshape(1, side, side, width).permute(0, 3, 1, 2)
    registers = w.get("register_tokens")
    if (h, wd) != (side, side):
        if registers is None:  # plain releases: interpolate_offset 0.1, no antialiasing
            grid = F.interpolate(
                grid, scale_factor=((h + 0.1) / side, (wd + 0.1) / side), mode="bicubic", antialias=False
            )
        else:  # register releases: the exact size, antialiased
            grid = F.interpolate(grid, size=(h, wd), mode="bicubic", antialias=True)
    x = x + torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, h * wd, width)], dim=1)
    if registers is not None:
        x = torch.cat([x[:, :1], registers.expand(batch, -1, -1), x[:, 1:]], dim=1)
    depth = len({k for k in w if k.endswith("norm1.weight")})
    head_dim = width // heads
    for i in range(depth):
        p = _block_key(w, i)
        y = _layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], eps)
        qkv = (y @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]).reshape(batch, -1, 3, heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(batch, -1, width)
        x = x + w[p + "ls1.gamma"] * (y @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"])
        y = _layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"], eps)
        if p + "mlp.w12.weight" in w:
            a, b = (y @ w[p + "mlp.w12.weight"].T + w[p + "mlp.w12.bias"]).chunk(2, dim=-1)
            y = (F.silu(a) * b) @ w[p + "mlp.w3.weight"].T + w[p + "mlp.w3.bias"]
        else:
            y = F.gelu(y @ w[p + "mlp.fc1.weight"].T + w[p + "mlp.fc1.bias"])
            y = y @ w[p + "mlp.fc2.weight"].T + w[p + "mlp.fc2.bias"]
        x = x + w[p + "ls2.gamma"] * y
    x = _layer_norm(x, w["norm.weight"], w["norm.bias"], eps)
    skip = 1 + (0 if registers is None else registers.shape[1])
    return x[:, 0], x[:, skip:]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over the largest absolute value of the reference."""
    return float((actual - expected).abs().max() / expected.abs().max())
