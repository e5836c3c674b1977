"""Backbone checkpoints converted to the model and loaded: :func:`create_backbone` reads the file once
(:func:`~locatdino.models.checkpoints.contents.read_backbone_file`: its container, weights, config,
position-embedding rule and trained geometry), builds the model once for those weights, converts them
(timm's ``checkpoint_filter_fn`` for the DINOv2 / DINOv3 releases) and loads them ``strict=True``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping

import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.models import get_pretrained_cfg, split_model_name_tag
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from locatdino.models.checkpoints.contents import GAUG, read_backbone_file
from locatdino.models.checkpoints.dinov2 import from_dinov2, is_dinov2_release
from locatdino.models.checkpoints.dinov3 import from_dinov3, is_dinov3_name, is_dinov3_release
from locatdino.models.checkpoints.families import family_refusal
from locatdino.models.checkpoints.hugging_face import heads_disagreement
from locatdino.models.checkpoints.locat_names import locat_entry, vanilla_entry
from locatdino.models.checkpoints.mismatch import checkpoint_mismatch, dtype_mismatch
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES, dino_interpolate_pos_embed, set_pos_embed_rule
from locatdino.models.checkpoints.transformers_settings import unhonoured_setting


def convert_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    model: nn.Module,
    pos_embed: str = "timm",
    name: str | None = None,
    fresh_gaug: bool = False,
) -> dict[str, torch.Tensor]:
    """Pure ``state_dict → state_dict`` conversion of backbone weights to ``model`` (timm's ``name``,
    which the refusals name when given).

    Drops classifier ``head.*`` weights when the model has no head (``num_classes=0``), resamples
    ``pos_embed`` to the model's grid by the ``pos_embed`` rule (``"timm"``: timm's
    ``resample_abs_pos_embed``; ``"dino"``: the reference DINO ViT's interpolation), and checks the GAug
    keys are present on both sides or neither (shapes are compared by :func:`create_backbone`).
    ``fresh_gaug``: weights without GAug for a LocAt model take the model's own GAug parameters (their
    initialisation), as :func:`~locatdino.models.locatify` of the vanilla model would.
    """
    target = model.state_dict()
    has_head = any(k.startswith("head.") for k in target)
    out = {k: v for k, v in state_dict.items() if has_head or not k.startswith("head.")}

    model_gaug = any(GAUG in k for k in target)
    ckpt_gaug = any(GAUG in k for k in out)
    swin = isinstance(model, SwinTransformer)
    keys = "layers.*.blocks.*.attn.gaug.*" if swin else "blocks.*.attn.gaug.*"
    label = name or "the model"
    if model_gaug and not ckpt_gaug and fresh_gaug:
        out.update({k: v for k, v in target.items() if GAUG in k})
    elif model_gaug and not ckpt_gaug:
        raise ValueError(
            f"checkpoint has no GAug parameters ({keys}) but {label} is a {'LocAtSwin' if swin else 'LocAtViT'}: "
            f"create {vanilla_entry(name or '', model)} from it and call locatdino.models.locatify(model) to add "
            "freshly initialised GAug"
        )
    if ckpt_gaug and not model_gaug:
        raise ValueError(
            f"checkpoint has GAug parameters ({keys}) but {label} has none: use {locat_entry(name or '', model)}"
        )

    if "pos_embed" in out and getattr(model, "pos_embed", None) is not None:
        out["pos_embed"] = _resample_pos_embed(out["pos_embed"], model, pos_embed)
    return out


def _release_at_model_grid(
    state_dict: dict[str, torch.Tensor], model: VisionTransformer, rule: str
) -> dict[str, torch.Tensor]:
    """A DINOv2 release with its ``pos_embed`` resampled by ``rule`` to ``model``'s grid (a build at
    another ``img_size`` than the release's), so that timm's conversion has nothing to resample by
    its own rule: for the register models the patch part alone moves, as after conversion."""
    pos_embed = state_dict.get("pos_embed")
    if pos_embed is None or model.pos_embed is None:
        return state_dict
    side = math.isqrt(pos_embed.shape[1] - 1)
    if (side, side) == tuple(model.patch_embed.grid_size):
        return state_dict
    return {**state_dict, "pos_embed": _resample_pos_embed(pos_embed, model, rule, num_prefix=1)}


def _resample_pos_embed(
    pos_embed: torch.Tensor, model: VisionTransformer, rule: str, num_prefix: int | None = None
) -> torch.Tensor:
    if num_prefix is None:
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
    if rule == "dino":
        return dino_interpolate_pos_embed(pos_embed, model.patch_embed.grid_size, num_prefix)
    return resample_abs_pos_embed(
        pos_embed, new_size=model.patch_embed.grid_size, old_size=(side, side), num_prefix_tokens=num_prefix
    )


def _check_registers(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer, name: str) -> None:
    """A DINOv2 file with registers for a model without (or the other way round) fails later on a
    ``pos_embed`` that is no square grid: say which model the file is for instead."""
    regs = state_dict.get("reg_token", state_dict.get("register_tokens"))  # timm's name, DINOv2's
    file_regs = 0 if regs is None else int(regs.shape[1])
    reg_token = getattr(model, "reg_token", None)  # timm's Eva (DINOv3) has no num_reg_tokens
    model_regs = 0 if reg_token is None else int(reg_token.shape[1])
    if file_regs != model_regs and "patch_embed.proj.weight" in state_dict:
        other = re.sub(r"_(reg\d+_)?dinov2", f"_reg{file_regs}_dinov2" if file_regs else "_dinov2", name)
        hint = f": use {other}" if other != name and timm.is_model(other) else ""
        raise ValueError(f"the file has {file_regs} register tokens but {name} has {model_regs}{hint}")


def _refuse_pretrained_tag(name: str) -> None:
    """A timm pretrained tag (``vit_small_patch16_224.dino``) without a checkpoint would silently be
    a random-init model under the pretrained weights' name: refuse, saying which file to pass."""
    base, tag = split_model_name_tag(name)
    if not tag:
        return
    try:
        cfg = get_pretrained_cfg(name)
    except Exception:  # noqa: BLE001 - an unknown tag: timm.create_model names it below
        cfg = None
    source = (cfg.url or (f"hf-hub:{cfg.hf_hub_id}" if cfg.hf_hub_id else "")) if cfg is not None else ""
    where = f" ({os.path.basename(source) if source.startswith('http') else source})" if source else ""
    raise ValueError(
        f"{name} names timm's pretrained weights '{tag}', which locatdino never downloads: pass the weights "
        f"file{where} as the checkpoint, or use {base} for a random init"
    )


def create_backbone(
    name: str,
    checkpoint: str | os.PathLike | None = None,
    which: str = "teacher",
    pos_embed: str = "auto",
    fresh_gaug: bool = False,
    **timm_kwargs,
) -> nn.Module:
    """``timm.create_model(name, num_classes=0, dynamic_img_size=True, **timm_kwargs)``, then load
    ``checkpoint`` (any supported container, ``which`` network) with ``strict=True``.

    Without an explicit ``patch_size``, the model takes the checkpoint's (its patch-embedding
    kernel). Without an explicit ``img_size``, the model is built at the resolution the checkpoint was
    trained at (its square ``pos_embed`` grid × the patch size): GAug's constants (c, b, eps,
    clamp) and its variance rescaling depend on the build grid, so a LocAtViT trained at 64 px
    and rebuilt at 224 px would compute a different attention. With ``dynamic_img_size`` the
    model still runs at any input size. Pass ``img_size`` to rebuild elsewhere (pos_embed is
    then resampled). Never downloads: ``pretrained`` is always False, and a pretrained tag
    (``vit_small_patch16_224.dino``) without a checkpoint is refused.

    ``pos_embed`` is how position embeddings are resampled at inputs of another grid
    (:mod:`locatdino.models.checkpoints.pos_embed`): ``"timm"``, ``"dino"`` (the reference DINO ViT's rule) or
    ``"auto"``: each release's own rule for full DINO training checkpoints and plain state dicts
    loaded into a vanilla ViT (``"dino"``; ``"timm"`` for DINOv2 with registers), ``"timm"``
    otherwise and without a checkpoint.

    ``checkpoint`` may also be a ``.safetensors`` file, a DINOv2 release or a Hugging Face
    ``Dinov2Model`` / ``ViTModel`` file or folder; a ``config.json`` beside Hugging Face weights
    that disagrees with them, or with the model's head count, activation, q, k, v bias or LayerNorm
    ε, is refused.

    ``fresh_gaug``: a file without GAug parameters (a vanilla release) loads into a LocAt model, its
    GAug left at the initialisation (continuing pretraining from a release into its LocAt version);
    refused otherwise, naming the vanilla model to load it into.

    A checkpoint that does not fit raises a one-line ``ValueError`` naming the file, the keys and
    shapes that disagree and, when they differ, both architectures.
    """
    if pos_embed not in ("auto", *POS_EMBED_RULES):
        raise ValueError(f"pos_embed must be 'auto', 'timm' or 'dino', got {pos_embed!r}")
    if not timm.is_model(name):
        close = difflib.get_close_matches(split_model_name_tag(name)[0], timm.list_models(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "timm.list_models() lists the names"
        raise ValueError(f"unknown model {name!r} ({hint})")
    if checkpoint is None:
        _refuse_pretrained_tag(name)
    timm_kwargs.setdefault("num_classes", 0)
    timm_kwargs.setdefault("dynamic_img_size", True)
    if is_dinov3_name(name):  # timm pools the average by default; DINOv3's class feature is its class token
        timm_kwargs.setdefault("global_pool", "token")
    timm_kwargs["pretrained"] = False
    if checkpoint is None:
        return set_pos_embed_rule(timm.create_model(name, **timm_kwargs), "timm" if pos_embed == "auto" else pos_embed)
    source = os.fspath(checkpoint)
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    contents = read_backbone_file(source, which)  # its errors name the file or its config.json
    raw, config = contents.state_dict, contents.config
    try:
        model = timm.create_model(name, **contents.build_kwargs(timm_kwargs))
        if refusal := family_refusal(raw, model, name):
            raise ValueError(refusal)
        if wrong_dtype := dtype_mismatch(raw, model.state_dict()):  # before any arithmetic on the tensors
            raise ValueError(wrong_dtype)
        if config is not None and (
            disagreement := heads_disagreement(config[1], model) or unhonoured_setting(config[1], model)
        ):
            raise ValueError(f"{config[0]}: {disagreement}")
        if getattr(model, "pos_embed", None) is None:  # RoPE, Swin: nothing to resample
            rule = "timm"
        else:
            rule = contents.pos_embed_rule if pos_embed == "auto" else pos_embed
        if is_dinov3_release(raw):
            raw = from_dinov3(raw, model, name)
        else:
            _check_registers(raw, model, name)
        if is_dinov2_release(raw):
            raw = from_dinov2(_release_at_model_grid(raw, model, rule), model)
        state_dict = convert_state_dict(raw, model, rule, name, fresh_gaug)
    except ValueError as err:
        if str(err).startswith(source) or (config is not None and str(err).startswith(config[0])):
            raise
        raise ValueError(f"{source}: {err}") from err
    mismatch = checkpoint_mismatch(state_dict, model.state_dict())
    if mismatch:
        raise ValueError(f"{source} does not fit {name}: {mismatch}")
    model.load_state_dict(state_dict, strict=True)
    return set_pos_embed_rule(model, rule)
