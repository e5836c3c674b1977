"""Why a checkpoint does not fit a model, in one line a user can act on.

``load_state_dict`` reports a wrong-architecture checkpoint as a ``RuntimeError`` of one line
per tensor (150 lines for ViT-B weights in a ViT-S) that never names the file. Here the keys and
shapes are compared first and the first few disagreements are named, followed by a guess of the
two architectures when they differ (width, depth, patch size, GAug), e.g.
``pos_embed: checkpoint [1, 197, 768] vs model [1, 197, 384] … — a ViT-B/16 checkpoint for a
ViT-S/16 model?``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

_SHOWN = 3  # disagreements named per kind; the rest are counted
# timm's names for the usual ViT widths and their depths (DINOv2's ViT-g: 1536 wide, 40 blocks)
_SIZE_NAMES = {192: "T", 384: "S", 768: "B", 1024: "L", 1280: "H", 1536: "g"}
_DEPTHS = {"L": 24, "H": 32, "g": 40}
# timm's Swin sizes: (width, depths) -> the size letter (Swin-T/4 is 96 wide, depths 2-2-6-2)
_SWIN_SIZES = {(96, (2, 2, 6, 2)): "T", (96, (2, 2, 18, 2)): "S", (128, (2, 2, 18, 2)): "B", (192, (2, 2, 18, 2)): "L"}
_SWIN_BLOCK = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.")


def _few(keys: Sequence[str]) -> str:
    more = f" (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def swin_depths(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, ...] | None:
    """The blocks per stage of a Swin state dict (``layers.{s}.blocks.{i}.*``, timm's and the official
    layout), ``(2, 2, 6, 2)`` for Swin-T; None for another layout."""
    blocks = {(int(m[1]), int(m[2])) for k in state_dict if (m := _SWIN_BLOCK.match(k))}
    if not blocks:
        return None
    return tuple(1 + max(i for s, i in blocks if s == stage) for stage in sorted({s for s, _ in blocks}))


def describe_architecture(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """``"ViT-S/16"``, ``"LocAtViT-T/16"``, ``"ViT (width 512, 8 blocks, /16)"``, ``"Swin-T/4"`` or
    ``"LocAtSwin (width 16, depths 2-2-2-2, /4)"`` from a ViT or Swin state dict's shapes; None when it
    has no patch embedding."""
    proj = state_dict.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4:
        return None
    width, patch = int(proj.shape[0]), int(proj.shape[-1])
    locat = "LocAt" if any(".attn.gaug." in k for k in state_dict) else ""
    depths = swin_depths(state_dict)
    if depths is not None:
        size = _SWIN_SIZES.get((width, depths))
        if size is not None:
            return f"{locat}Swin-{size}/{patch}"
        return f"{locat}Swin (width {width}, depths {'-'.join(map(str, depths))}, /{patch})"
    depth = len({m.group(1) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))})
    family = f"{locat}ViT"
    size = _SIZE_NAMES.get(width)
    if size is not None and depth == _DEPTHS.get(size, 12):
        return f"{family}-{size}/{patch}"
    return f"{family} (width {width}, {depth} blocks, /{patch})"


def dtype_mismatch(state_dict: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]) -> str | None:
    """One line naming the first key (in ``target``'s order) whose tensor is not floating point where
    ``target``'s is, and its dtype; None when every shared key's dtype can hold the model's values."""
    wrong = [  # in the model's order: the same first key whatever order the file keeps
        k
        for k, v in target.items()
        if k in state_dict and v.is_floating_point() and not state_dict[k].is_floating_point()
    ]
    if not wrong:
        return None
    first = wrong[0]
    more = f" (and {len(wrong) - 1} more tensor{'s' if len(wrong) > 2 else ''})" if len(wrong) > 1 else ""
    return (
        f"{first} is {_dtype(state_dict[first])} in the file but {_dtype(target[first])} in the model{more}: "
        "not floating-point weights (a quantised or damaged file, or a safetensors header that misstates "
        "the dtype?)"
    )


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def checkpoint_mismatch(state_dict: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor]) -> str | None:
    """One line naming the keys and shapes in which ``state_dict`` (the converted checkpoint)
    and ``target`` (the model's state dict) disagree, or None when it loads ``strict=True``
    (and every floating-point parameter gets floating-point values: :func:`dtype_mismatch`)."""
    shapes = [k for k, v in state_dict.items() if k in target and tuple(v.shape) != tuple(target[k].shape)]
    missing = [k for k in target if k not in state_dict]
    unexpected = [k for k in state_dict if k not in target]
    if not (shapes or missing or unexpected):
        return dtype_mismatch(state_dict, target)
    parts = [f"{k}: checkpoint {list(state_dict[k].shape)} vs model {list(target[k].shape)}" for k in shapes[:_SHOWN]]
    if len(shapes) > _SHOWN:
        parts.append(f"{len(shapes) - _SHOWN} more shapes differ")
    if missing:
        parts.append(f"missing {_few(missing)}")
    if unexpected:
        parts.append(f"unexpected {_few(unexpected)}")
    text = "; ".join(parts)
    ours, theirs = describe_architecture(target), describe_architecture(state_dict)
    if ours and theirs and ours != theirs:
        text += f" — a {theirs} checkpoint for a {ours} model?"
    return text
