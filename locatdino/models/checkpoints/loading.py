"""Backbone checkpoints: read every supported container, convert to the model, build + load.

Supported containers (docs/checkpoints.md), told apart by their top-level structure, never by guessing
from parameter names:

- Lightning checkpoint of this project: has ``pytorch-lightning_version``; backbone keys are
  ``state_dict["teacher.backbone.*"]`` / ``["student.backbone.*"]`` (DINO) or
  ``["classifier.backbone.*"]`` (supervised); ``checkpoint["evaluated_network"]`` names the network
  its objective evaluates, which is what ``which="teacher"`` (the default) reads.
- DINOv2's ``teacher_checkpoint.pth``: only a ``teacher`` dict, keys ``backbone.*`` (DINOv2's layout,
  chunked ``blocks.{chunk}.{i}`` with ``block_chunks``) beside ``dino_head.*`` / ``ibot_head.*``.
- Full DINO training checkpoint: has both ``student`` and ``teacher`` dicts; student keys carry
  DDP's ``module.`` prefix, both carry ``backbone.`` / ``head.`` (the head, with its weight-norm
  ``weight_g``/``weight_v`` or ``parametrizations.weight.original0/1``, is not backbone and dropped).
- timm / DeiT training checkpoint: a ``state_dict`` or ``model`` dict of plain model keys.
- Plain state dict (released DINO backbones, timm weights, public LocAtViT checkpoints with GAug
  keys): every value a tensor. A DINOv2 or DINOv3 release (``dinov2.py``, ``dinov3.py``) or a
  Hugging Face transformers file (``hugging_face.py``, ``hugging_face_dinov3.py``) is a plain state
  dict in its own layout, renamed by :func:`to_timm_keys` and, for the releases, converted by timm's
  ``checkpoint_filter_fn`` once the model is built. A ``.safetensors`` file (``safetensors_file.py``)
  and a Hugging Face model folder (its ``model.safetensors`` / ``pytorch_model.bin``) read as plain
  state dicts.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import zipfile
from collections.abc import Mapping

import timm
import torch
from timm.layers import resample_abs_pos_embed
from timm.models import get_pretrained_cfg, split_model_name_tag
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from locatdino.models.checkpoints.dinov2 import from_dinov2, is_dinov2_release, release_pos_embed_rule, unchunked
from locatdino.models.checkpoints.dinov3 import from_dinov3, is_dinov3_name, is_dinov3_release
from locatdino.models.checkpoints.families import family_refusal
from locatdino.models.checkpoints.hugging_face import (
    config_disagreement,
    from_transformers,
    heads_disagreement,
    is_transformers_layout,
    transformers_config,
    weights_in_folder,
)
from locatdino.models.checkpoints.hugging_face_dinov3 import (
    dinov3_config_disagreement,
    from_transformers_dinov3,
    is_transformers_dinov3,
)
from locatdino.models.checkpoints.locat_names import locat_entry, vanilla_entry
from locatdino.models.checkpoints.mismatch import checkpoint_mismatch, dtype_mismatch
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES, dino_interpolate_pos_embed, set_pos_embed_rule
from locatdino.models.checkpoints.safetensors_file import (
    TORCH_MAGIC,
    is_safetensors,
    load_safetensors,
    safetensors_metadata,
)
from locatdino.models.checkpoints.transformers_settings import unhonoured_setting

_GAUG = ".attn.gaug."
# what `locatdino export` writes into every file it makes (a .pth's state-dict `_metadata`, a
# safetensors header), so that it is known by its contents, never by its shape
EXPORT_KEY = "locatdino_export"
WRITTEN_BY = "locatdino export"
# Where a Lightning checkpoint of locatdino.ssl names the network its objective evaluates.
EVALUATED_NETWORK_KEY = "evaluated_network"


def load_backbone_state_dict(path: str | os.PathLike, which: str = "teacher") -> dict[str, torch.Tensor]:
    """Backbone weights from a checkpoint file of any supported container, timm key names (a DINOv2
    or DINOv3 release in its own layout, see :func:`extract_backbone`).

    ``which`` (``"teacher"`` or ``"student"``) picks the network in DINO and Lightning
    checkpoints; plain files hold one network and ignore it. Loaded with ``weights_only=True``
    (``argparse.Namespace``, which DINO stores as ``args``, is allowed).
    """
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    return extract_backbone(load_checkpoint(path), which, os.fspath(path))


def load_checkpoint(path: str | os.PathLike, mmap: bool = False) -> object:
    """The whole checkpoint object of ``path`` on CPU: a ``.safetensors`` file's tensors (the
    safetensors package), else ``torch.load`` with ``weights_only=True`` (``argparse.Namespace``,
    which DINO stores as ``args``, is allowed); a Hugging Face model folder is read through its
    weights file. A file that cannot be read raises a one-line ``ValueError`` naming it and saying,
    in plain words, what it is instead. ``mmap``: tensors stay memory-mapped on disk, for callers
    that read only metadata (torch maps zip-format files only: a legacy pickle is read whole)."""
    source = os.fspath(path)
    if os.path.isdir(source):
        source = weights_in_folder(source)
    if os.path.isfile(source) and is_safetensors(source):
        return load_safetensors(source)
    mmap = mmap and zipfile.is_zipfile(source)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - re-raised with the file name, one line
        raise ValueError(f"{source}: {_unreadable(source, err)}") from err


def _unreadable(source: str, err: Exception) -> str:
    """Why ``source`` is not a checkpoint, from the file itself rather than torch's internals."""
    if not os.path.exists(source):
        return "no such file"
    with open(source, "rb") as f:
        head = f.read(512)
    if not head:
        return "is empty (0 bytes), not a checkpoint (an interrupted download or copy?)"
    if head.startswith(b"version https://git-lfs"):
        return "is a Git LFS pointer, not the weights: fetch them with `git lfs pull`"
    if not head.startswith(TORCH_MAGIC):
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            return (
                f"is not a torch checkpoint (neither torch's zip format nor a pickle; {os.path.getsize(source)} bytes)"
            )
        start = " ".join(text.split())[:40]
        return f"is a text file, not a torch checkpoint (it starts with {start!r})"
    # torch's zip format ends with the archive's directory; a legacy pickle ends with its tensors
    if (
        (head.startswith(b"PK") and not zipfile.is_zipfile(source))
        or isinstance(err, EOFError)
        or ("unexpected EOF" in str(err))
    ):
        return (
            f"is truncated ({os.path.getsize(source)} bytes, the end of the checkpoint is missing: an interrupted "
            "save, download or copy?)"
        )
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    unsupported = re.search(r"Unsupported (global: GLOBAL \S+|operand \d+)", str(err))
    if unsupported:  # torch's first line only says that weights_only failed
        return (
            f"cannot be read with weights_only=True (unsupported {unsupported.group(1)}): it holds Python objects "
            "besides tensors and containers; save its state dict with torch.save(model.state_dict(), path)"
        )
    return f"cannot be read as a torch checkpoint with weights_only=True: {lines[0] if lines else type(err).__name__}"


def network_name(checkpoint: Mapping, which: str) -> str:
    """The network ``which`` picks in a loaded checkpoint: ``"teacher"`` is the one its objective
    evaluates (a supervised Lightning checkpoint's ``"classifier"``), anything else as given."""
    return (checkpoint.get(EVALUATED_NETWORK_KEY) or which) if which == "teacher" else which


def extract_backbone(checkpoint: object, which: str, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The backbone state dict inside a loaded checkpoint object (see module docstring) in timm's
    keys (a DINOv2 or DINOv3 release in its own layout: timm's conversion of those needs the model,
    :func:`create_backbone`), refused when a weight is NaN or infinite (a diverged run's file has the
    right shapes but scores noise)."""
    return _finite(to_timm_keys(_backbone_entries(checkpoint, which, source)), source)


def to_timm_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A released layout's weights in timm's keys (a transformers ``ViTModel``, ``hugging_face.py``), or
    in a release's layout that timm converts: a DINOv2 or DINOv3 release, a transformers
    ``Dinov2Model`` or ``DINOv3ViTModel`` renamed to one. timm's conversion of a release needs the
    model (``dinov2.py``, ``dinov3.py``): :func:`create_backbone` makes it after the build. timm-key
    weights as they are."""
    if is_transformers_dinov3(state_dict):
        return from_transformers_dinov3(state_dict)
    if is_dinov3_release(state_dict):  # before DINOv2's test: both hold iBOT's mask_token
        return state_dict
    if is_transformers_layout(state_dict):
        state_dict = from_transformers(state_dict)
    return unchunked(state_dict) if is_dinov2_release(state_dict) else state_dict


def _finite(state_dict: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    bad = [k for k, v in state_dict.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        count = sum(int((~torch.isfinite(state_dict[k])).sum()) for k in bad)
        raise ValueError(
            f"{source}: {count} NaN/inf weight value(s) in {bad[0]}"
            + (f" and {len(bad) - 1} other tensor(s)" if len(bad) > 1 else "")
            + " (a diverged run? use a checkpoint from before it)"
        )
    return state_dict


def _backbone_entries(checkpoint: object, which: str, source: str) -> dict[str, torch.Tensor]:
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"{source}: expected a dict checkpoint, found {type(checkpoint).__name__}")
    if "pytorch-lightning_version" in checkpoint:
        prefix = f"{network_name(checkpoint, which)}.backbone."
        return _with_prefix(checkpoint["state_dict"], prefix, f"{source} (Lightning)")
    if "student" in checkpoint and "teacher" in checkpoint:
        return _with_prefix(_without_ddp(checkpoint[which]), "backbone.", f"{source} (DINO '{which}')")
    # DINOv2's teacher_checkpoint.pth
    if list(checkpoint) == ["teacher"] and isinstance(checkpoint["teacher"], Mapping):
        if which == "student":
            raise ValueError(f"{source}: holds only the teacher (DINOv2's teacher_checkpoint.pth): use which='teacher'")
        return _with_prefix(checkpoint["teacher"], "backbone.", f"{source} (DINOv2 'teacher')")
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
        return {k[len("module.") :]: v for k, v in state_dict.items()}
    return dict(state_dict)


def _with_prefix(state_dict: Mapping[str, torch.Tensor], prefix: str, source: str) -> dict[str, torch.Tensor]:
    out = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not out:
        found = sorted({k.split(".")[0] for k in state_dict})
        raise ValueError(f"{source}: no keys start with '{prefix}' (top-level names found: {', '.join(found)})")
    return _tensors_only(out, source)


def _tensors_only(state_dict: Mapping[str, object], source: str) -> dict[str, torch.Tensor]:
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{source}: entry '{key}' is a {type(value).__name__}, not a tensor")
    return dict(state_dict)


def convert_state_dict(
    state_dict: Mapping[str, torch.Tensor], model: nn.Module, pos_embed: str = "timm", name: str | None = None
) -> dict[str, torch.Tensor]:
    """Pure ``state_dict → state_dict`` conversion of backbone weights to ``model`` (timm's ``name``,
    which the refusals name when given).

    Drops classifier ``head.*`` weights when the model has no head (``num_classes=0``), resamples
    ``pos_embed`` to the model's grid by the ``pos_embed`` rule (``"timm"``: timm's
    ``resample_abs_pos_embed``; ``"dino"``: the reference DINO ViT's interpolation), and checks the GAug
    keys are present on both sides or neither (shapes are compared by :func:`create_backbone`).
    """
    target = model.state_dict()
    has_head = any(k.startswith("head.") for k in target)
    out = {k: v for k, v in state_dict.items() if has_head or not k.startswith("head.")}

    model_gaug = any(_GAUG in k for k in target)
    ckpt_gaug = any(_GAUG in k for k in out)
    swin = isinstance(model, SwinTransformer)
    keys = "layers.*.blocks.*.attn.gaug.*" if swin else "blocks.*.attn.gaug.*"
    label = name or "the model"
    if model_gaug and not ckpt_gaug:
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


def _trained_img_size(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer) -> tuple[int, int] | None:
    """Image size ``(H, W)`` of the square grid behind the checkpoint's ``pos_embed`` when it differs
    from ``model``'s build grid; None when it matches, is absent or is not square."""
    pos_embed = state_dict.get("pos_embed")
    if pos_embed is None or getattr(model, "pos_embed", None) is None or pos_embed.shape == model.pos_embed.shape:
        return None
    num_prefix = _file_prefix(state_dict, model)
    side = math.isqrt(max(pos_embed.shape[1] - num_prefix, 0))
    if side == 0 or side * side != pos_embed.shape[1] - num_prefix:
        return None
    patch_h, patch_w = model.patch_embed.patch_size
    return side * patch_h, side * patch_w


def _file_prefix(state_dict: Mapping[str, torch.Tensor], model: VisionTransformer) -> int:
    """The tokens before the patch grid in the file's ``pos_embed``: a DINOv2 release's class token,
    else as in ``model``."""
    if is_dinov2_release(state_dict):
        return 1
    return 0 if model.no_embed_class else model.num_prefix_tokens


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


def exported_pos_embed_rule(source: str, checkpoint: object) -> str | None:
    """The position-embedding rule ``locatdino export`` recorded in ``source`` (the rule the
    exported backbone ran with: an export of a ``fit`` run keeps timm's, an export of a release
    its own), or None for a file export did not write."""
    if os.path.isdir(source):
        source = weights_in_folder(source)
    if is_safetensors(source):
        found: object = safetensors_metadata(source)
    else:
        found = (getattr(checkpoint, "_metadata", None) or {}).get(EXPORT_KEY)
    if not isinstance(found, Mapping) or found.get("written_by") != WRITTEN_BY:
        return None
    rule = found.get("pos_embed_rule")
    return rule if rule in POS_EMBED_RULES else None


def _default_pos_embed_rule(checkpoint: object, state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> str:
    """``auto``: the release's own rule for the formats released DINO models come in — a full DINO
    training checkpoint (the reference DINO rule), or a plain state dict (a release file, a
    ``.safetensors`` or Hugging Face file) loaded into a vanilla ViT: the reference DINO rule, or
    timm's for DINOv2 with registers (``state_dict`` has their ``register_tokens`` / ``reg_token``) — and
    timm's rule for this project's Lightning checkpoints, LocAtViT and timm/DeiT training checkpoints."""
    if not isinstance(checkpoint, Mapping) or "pytorch-lightning_version" in checkpoint:
        return "timm"
    if "student" in checkpoint and "teacher" in checkpoint:
        return "dino"
    if list(checkpoint) == ["teacher"]:  # DINOv2's teacher checkpoint: the release's rule
        return release_pos_embed_rule(state_dict)
    plain = bool(checkpoint) and all(isinstance(v, torch.Tensor) for v in checkpoint.values())
    vanilla = not any(_GAUG in k for k in model.state_dict())
    return release_pos_embed_rule(state_dict) if plain and vanilla else "timm"


def create_backbone(
    name: str,
    checkpoint: str | os.PathLike | None = None,
    which: str = "teacher",
    pos_embed: str = "auto",
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
    model = timm.create_model(name, **timm_kwargs)
    if checkpoint is None:
        return set_pos_embed_rule(model, "timm" if pos_embed == "auto" else pos_embed)
    source = os.fspath(checkpoint)
    if which not in ("teacher", "student"):
        raise ValueError(f"which must be 'teacher' or 'student', got {which!r}")
    config = None  # a transformers config.json beside the weights: (path, contents)
    try:
        loaded = load_checkpoint(source)
        entries = _backbone_entries(loaded, which, source)
        config = transformers_config(source)
        if config is not None and (
            disagreement := config_disagreement(config[1], entries) or dinov3_config_disagreement(config[1], entries)
        ):
            raise ValueError(f"{config[0]}: {disagreement} (does this config.json belong to these weights?)")
        raw = _finite(to_timm_keys(entries), source)
        if refusal := family_refusal(raw, model, name):
            raise ValueError(refusal)
        if wrong_dtype := dtype_mismatch(raw, model.state_dict()):  # before any arithmetic on the tensors
            raise ValueError(wrong_dtype)
        patch = raw.get("patch_embed.proj.weight")  # [D, 3, p, p]: a patch-8 run rebuilt at its patch size
        if (
            "patch_size" not in timm_kwargs
            and patch is not None
            and patch.ndim == 4
            and (tuple(patch.shape[-2:]) != tuple(model.patch_embed.patch_size))
        ):
            timm_kwargs["patch_size"] = tuple(patch.shape[-2:])
            model = timm.create_model(name, **timm_kwargs)
        trained_size = _trained_img_size(raw, model)
        if "img_size" not in timm_kwargs and trained_size is not None:
            model = timm.create_model(name, img_size=trained_size, **timm_kwargs)
        if config is not None and (
            disagreement := heads_disagreement(config[1], model) or unhonoured_setting(config[1], model)
        ):
            raise ValueError(f"{config[0]}: {disagreement}")
        if getattr(model, "pos_embed", None) is None:  # RoPE: nothing to resample
            rule = "timm"
        elif pos_embed == "auto":
            rule = exported_pos_embed_rule(source, loaded) or _default_pos_embed_rule(loaded, raw, model)
        else:
            rule = pos_embed
        if is_dinov3_release(raw):
            raw = from_dinov3(raw, model, name)
        else:
            _check_registers(raw, model, name)
        if is_dinov2_release(raw):
            raw = from_dinov2(_release_at_model_grid(raw, model, rule), model)
        state_dict = convert_state_dict(raw, model, rule, name)
    except ValueError as err:
        if str(err).startswith(source) or (config is not None and str(err).startswith(config[0])):
            raise
        raise ValueError(f"{source}: {err}") from err
    mismatch = checkpoint_mismatch(state_dict, model.state_dict())
    if mismatch:
        raise ValueError(f"{source} does not fit {name}: {mismatch}")
    model.load_state_dict(state_dict, strict=True)
    return set_pos_embed_rule(model, rule)
