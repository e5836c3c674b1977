"""Backbone checkpoints: read every supported container, convert to the model, build + load.

Supported containers (SPEC §2.1), told apart by their top-level structure, never by guessing
from parameter names:

- Lightning checkpoint of this project: has ``pytorch-lightning_version``; backbone keys are
  ``state_dict["teacher.backbone.*"]`` / ``["student.backbone.*"]``.
- Full DINO training checkpoint: has both ``student`` and ``teacher`` dicts; student keys carry
  DDP's ``module.`` prefix, both carry ``backbone.`` / ``head.`` (the head, with its weight-norm
  ``weight_g``/``weight_v`` or ``parametrizations.weight.original0/1``, is not backbone and dropped).
- timm / DeiT training checkpoint: a ``state_dict`` or ``model`` dict of plain model keys.
- Plain state dict (released DINO backbones, timm weights, public LocAtViT checkpoints with GAug
  keys): every value a tensor.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping

import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

_GAUG = ".attn.gaug."


def load_backbone_state_dict(path: str | os.PathLike, which: str = "teacher") -> dict[str, torch.Tensor]:
    """Backbone weights from a checkpoint file of any supported container, timm key names.

    ``which`` (``"teacher"`` or ``"student"``) picks the network in DINO and Lightning
    checkpoints; plain files hold one network and ignore it. Loaded with ``weights_only=True``
    (``argparse.Namespace``, which DINO stores as ``args``, is allowed).
    """
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    return extract_backbone(load_checkpoint(path), which, os.fspath(path))


def load_checkpoint(path: str | os.PathLike) -> object:
    """The whole checkpoint object of ``path`` on CPU, ``weights_only=True`` (``argparse.Namespace``,
    which DINO stores as ``args``, is allowed); a file torch cannot read raises a one-line
    ``ValueError`` naming it."""
    source = os.fspath(path)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - re-raised with the file name, one line
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{source}: cannot be read as a torch checkpoint with weights_only=True: {first_line}") from err


def extract_backbone(checkpoint: object, which: str, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The backbone state dict inside a loaded checkpoint object (see module docstring)."""
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"{source}: expected a dict checkpoint, found {type(checkpoint).__name__}")
    if "pytorch-lightning_version" in checkpoint:
        return _with_prefix(checkpoint["state_dict"], f"{which}.backbone.", f"{source} (Lightning)")
    if "student" in checkpoint and "teacher" in checkpoint:
        return _with_prefix(_without_ddp(checkpoint[which]), "backbone.", f"{source} (DINO '{which}')")
    for key in ("state_dict", "model"):
        if isinstance(checkpoint.get(key), Mapping):
            return _tensors_only(_without_ddp(checkpoint[key]), f"{source} ['{key}']")
    if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return _without_ddp(dict(checkpoint))
    keys = ", ".join(list(map(str, checkpoint))[:8]) or "nothing"
    raise ValueError(
        f"{source}: not a known checkpoint layout (found top-level keys: {keys}); expected a state dict, "
        "a DINO checkpoint with 'student'/'teacher', a Lightning checkpoint, or a 'state_dict'/'model' dict"
    )


def _without_ddp(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip DistributedDataParallel's ``module.`` when every key carries it."""
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return {k[len("module."):]: v for k, v in state_dict.items()}
    return dict(state_dict)


def _with_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str, source: str) -> dict[str, torch.Tensor]:
    out = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not out:
        found = sorted({k.split(".")[0] for k in state_dict})
        raise ValueError(f"{source}: no keys start with '{prefix}' (top-level names found: {', '.join(found)})")
    return _tensors_only(out, source)


def _tensors_only(state_dict: Mapping[str, object], source: str) -> dict[str, torch.Tensor]:
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{source}: entry '{key}' is a {type(value).__name__}, not a tensor")
    return dict(state_dict)


def convert_state_dict(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer) -> dict[str, torch.Tensor]:
    """Pure ``state_dict → state_dict`` conversion of backbone weights to ``model``.

    Drops classifier ``head.*`` weights when the model has no head (``num_classes=0``), resamples
    ``pos_embed`` to the model's grid (timm's ``resample_abs_pos_embed``), and checks the GAug
    keys: present on both sides or neither, with matching shapes.
    """
    target = model.state_dict()
    has_head = any(k.startswith("head.") for k in target)
    out = {k: v for k, v in state_dict.items() if has_head or not k.startswith("head.")}

    model_gaug = any(_GAUG in k for k in target)
    ckpt_gaug = any(_GAUG in k for k in out)
    if model_gaug and not ckpt_gaug:
        raise ValueError(
            "checkpoint has no GAug parameters (blocks.*.attn.gaug.*) but the model is a LocAtViT: create the "
            "vanilla ViT from it and call locatdino.models.locatify(model) to add freshly initialised GAug"
        )
    if ckpt_gaug and not model_gaug:
        raise ValueError("checkpoint has GAug parameters (blocks.*.attn.gaug.*) but the model has none: use a locatvit_* model")
    for key, value in out.items():
        if _GAUG in key and key in target and value.shape != target[key].shape:
            raise ValueError(
                f"GAug shape mismatch for '{key}': checkpoint {tuple(value.shape)}, model {tuple(target[key].shape)}"
            )

    if "pos_embed" in out and model.pos_embed is not None:
        out["pos_embed"] = _resample_pos_embed(out["pos_embed"], model)
    return out


def _trained_img_size(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer) -> tuple[int, int] | None:
    """Image size ``(H, W)`` of the square grid behind the checkpoint's ``pos_embed`` when it differs
    from ``model``'s build grid; None when it matches, is absent or is not square."""
    pos_embed = state_dict.get("pos_embed")
    if pos_embed is None or getattr(model, "pos_embed", None) is None or pos_embed.shape == model.pos_embed.shape:
        return None
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    side = math.isqrt(max(pos_embed.shape[1] - num_prefix, 0))
    if side == 0 or side * side != pos_embed.shape[1] - num_prefix:
        return None
    patch_h, patch_w = model.patch_embed.patch_size
    return side * patch_h, side * patch_w


def _resample_pos_embed(pos_embed: torch.Tensor, model: VisionTransformer) -> torch.Tensor:
    num_prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    if pos_embed.shape == model.pos_embed.shape:
        return pos_embed
    num_patches = pos_embed.shape[1] - num_prefix
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"pos_embed of shape {tuple(pos_embed.shape)} is not a square grid plus {num_prefix} prefix tokens; "
            f"model expects {tuple(model.pos_embed.shape)}"
        )
    return resample_abs_pos_embed(
        pos_embed, new_size=model.patch_embed.grid_size, old_size=(side, side), num_prefix_tokens=num_prefix
    )


def create_backbone(
    name: str, checkpoint: str | os.PathLike | None = None, which: str = "teacher", **timm_kwargs
) -> nn.Module:
    """``timm.create_model(name, num_classes=0, dynamic_img_size=True, **timm_kwargs)``, then load
    ``checkpoint`` (any supported container, ``which`` network) with ``strict=True``.

    Without an explicit ``patch_size``, the model takes the checkpoint's (its patch-embedding
    kernel). Without an explicit ``img_size``, the model is built at the resolution the checkpoint was
    trained at (its square ``pos_embed`` grid × the patch size): GAug's constants (c, b, eps,
    clamp) and its variance rescaling depend on the build grid, so a LocAtViT trained at 64 px
    and rebuilt at 224 px would compute a different attention. With ``dynamic_img_size`` the
    model still runs at any input size. Pass ``img_size`` to rebuild elsewhere (pos_embed is
    then resampled). Never downloads: ``pretrained`` is always False.
    """
    timm_kwargs.setdefault("num_classes", 0)
    timm_kwargs.setdefault("dynamic_img_size", True)
    timm_kwargs["pretrained"] = False
    model = timm.create_model(name, **timm_kwargs)
    if checkpoint is None:
        return model
    source = os.fspath(checkpoint)
    try:
        raw = load_backbone_state_dict(source, which)
        patch = raw.get("patch_embed.proj.weight")  # [D, 3, p, p]: a patch-8 run rebuilt at its patch size
        if "patch_size" not in timm_kwargs and patch is not None and patch.ndim == 4 and (
                tuple(patch.shape[-2:]) != tuple(model.patch_embed.patch_size)):
            timm_kwargs["patch_size"] = tuple(patch.shape[-2:])
            model = timm.create_model(name, **timm_kwargs)
        trained_size = _trained_img_size(raw, model)
        if "img_size" not in timm_kwargs and trained_size is not None:
            model = timm.create_model(name, img_size=trained_size, **timm_kwargs)
        state_dict = convert_state_dict(raw, model)
    except ValueError as err:
        if str(err).startswith(source):
            raise
        raise ValueError(f"{source}: {err}") from err
    expected = model.state_dict().keys()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{source} does not match {name}: missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    model.load_state_dict(state_dict, strict=True)
    return model
