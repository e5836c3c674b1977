"""What a backbone file holds, read in one pass: :func:`read_backbone_file`.

Supported containers (docs/checkpoints.md), told apart once, by their top-level structure, never by
guessing from parameter names:

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

The file is opened once (``torch.load`` or one ``safe_open``); everything the build needs is read
from what that returned: the backbone's weights, its container, a ``config.json`` beside Hugging Face
weights, the position-embedding rule of ``auto`` and the geometry the weights were trained at (patch,
position-embedding grid), so that :func:`~locatdino.models.checkpoints.loading.create_backbone` builds
the model once, as timm's ``pretrained_filter_fn`` expects a model built for the weights.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from locatdino.models.checkpoints.dinov2 import is_dinov2_release, release_pos_embed_rule, unchunked
from locatdino.models.checkpoints.dinov3 import is_dinov3_release
from locatdino.models.checkpoints.hugging_face import (
    config_disagreement,
    from_transformers,
    is_transformers_layout,
    transformers_config,
    weights_in_folder,
)
from locatdino.models.checkpoints.hugging_face_dinov3 import (
    dinov3_config_disagreement,
    from_transformers_dinov3,
    is_transformers_dinov3,
)
from locatdino.models.checkpoints.pos_embed import POS_EMBED_RULES
from locatdino.models.checkpoints.safetensors_file import (
    TORCH_MAGIC,
    SafetensorsTensors,
    is_safetensors,
    load_safetensors,
)

GAUG = ".attn.gaug."
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
    ``create_backbone``), refused when a weight is NaN or infinite (a diverged run's file has the
    right shapes but scores noise)."""
    return _finite(to_timm_keys(backbone_entries(checkpoint, which, source)[1]), source)


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


def backbone_entries(checkpoint: object, which: str, source: str) -> tuple[str, dict[str, torch.Tensor]]:
    """``(container, the backbone's entries)`` of a loaded checkpoint object: the one place its
    container is decided (see module docstring)."""
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"{source}: expected a dict checkpoint, found {type(checkpoint).__name__}")
    if "pytorch-lightning_version" in checkpoint:
        prefix = f"{network_name(checkpoint, which)}.backbone."
        return LIGHTNING, _with_prefix(checkpoint["state_dict"], prefix, f"{source} (Lightning)")
    if "student" in checkpoint and "teacher" in checkpoint:
        return DINO_TRAINING, _with_prefix(_without_ddp(checkpoint[which]), "backbone.", f"{source} (DINO '{which}')")
    # DINOv2's teacher_checkpoint.pth
    if list(checkpoint) == ["teacher"] and isinstance(checkpoint["teacher"], Mapping):
        if which == "student":
            raise ValueError(f"{source}: holds only the teacher (DINOv2's teacher_checkpoint.pth): use which='teacher'")
        return DINOV2_TEACHER, _with_prefix(checkpoint["teacher"], "backbone.", f"{source} (DINOv2 'teacher')")
    for key in ("state_dict", "model"):
        if isinstance(checkpoint.get(key), Mapping):
            return TRAINING, _tensors_only(_without_ddp(checkpoint[key]), f"{source} ['{key}']")
    if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return STATE_DICT, _without_ddp(dict(checkpoint))
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


def exported_pos_embed_rule(checkpoint: object) -> str | None:
    """The position-embedding rule ``locatdino export`` recorded in a loaded file (a safetensors
    header's metadata, a ``.pth`` state dict's ``_metadata``): the rule the exported backbone ran with
    (an export of a ``fit`` run keeps timm's, an export of a release its own), or None for a file
    export did not write."""
    if isinstance(checkpoint, SafetensorsTensors):
        found: object = checkpoint.metadata
    else:
        found = (getattr(checkpoint, "_metadata", None) or {}).get(EXPORT_KEY)
    if not isinstance(found, Mapping) or found.get("written_by") != WRITTEN_BY:
        return None
    rule = found.get("pos_embed_rule")
    return rule if rule in POS_EMBED_RULES else None


def _container_pos_embed_rule(container: str, state_dict: Mapping[str, torch.Tensor]) -> str:
    """``auto``: the release's own rule for the formats released DINO models come in — a full DINO
    training checkpoint (the reference DINO rule), DINOv2's teacher checkpoint or a plain state dict
    without GAug (a release file, a ``.safetensors`` or Hugging Face file): the reference DINO rule,
    or timm's for DINOv2 with registers (``state_dict`` has their ``register_tokens`` / ``reg_token``) —
    and timm's rule for this project's Lightning checkpoints, LocAtViTs and timm/DeiT training
    checkpoints."""
    if container == DINO_TRAINING:
        return "dino"
    vanilla = not any(GAUG in k for k in state_dict)
    if container == DINOV2_TEACHER or (container == STATE_DICT and vanilla):
        return release_pos_embed_rule(state_dict)
    return "timm"


# the containers :func:`backbone_entries` tells apart
LIGHTNING, DINO_TRAINING, DINOV2_TEACHER, TRAINING, STATE_DICT = (
    "Lightning",
    "DINO training checkpoint",
    "DINOv2 teacher",
    "training checkpoint",
    "state dict",
)


@dataclass(frozen=True)
class BackboneFile:
    """What a backbone file holds (:func:`read_backbone_file`).

    ``state_dict``: the backbone's weights in timm's keys, or in a DINOv2 / DINOv3 release's layout
    (timm's conversion of those needs the model). ``pos_embed_rule``: the rule ``auto`` picks (recorded
    by ``export``, else the container's). ``patch``: the patch embedding's kernel ``(h, w)``; ``grid``:
    the square position-embedding grid the weights were trained at; each None when the file has none.
    """

    source: str
    container: str
    state_dict: dict[str, torch.Tensor]
    config: tuple[str, dict[str, Any]] | None
    pos_embed_rule: str
    patch: tuple[int, int] | None
    grid: tuple[int, int] | None

    def build_kwargs(self, timm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``timm_kwargs`` plus the file's patch size and image size (its grid × the patch) where not
        given: GAug's constants depend on the build grid, so a model is built at the grid it was
        trained at (and runs at any other with ``dynamic_img_size``)."""
        kwargs = dict(timm_kwargs)
        if "patch_size" not in kwargs and self.patch is not None:
            kwargs["patch_size"] = _int_if_square(self.patch)
        patch = _pair(kwargs.get("patch_size"))
        if "img_size" not in kwargs and self.grid is not None and patch is not None:
            kwargs["img_size"] = _int_if_square((self.grid[0] * patch[0], self.grid[1] * patch[1]))
        return kwargs


def _int_if_square(size: tuple[int, int]) -> int | tuple[int, int]:
    """timm's models take a side or ``(h, w)``; some compute with it as a number (Swin's feature strides)."""
    return size[0] if size[0] == size[1] else size


def _pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, int):
        return value, value
    return (int(value[0]), int(value[1])) if isinstance(value, (tuple, list)) and len(value) == 2 else None


def read_backbone_file(source: str, which: str = "teacher") -> BackboneFile:
    """Everything :func:`~locatdino.models.checkpoints.loading.create_backbone` needs of ``source``
    (its ``which`` network: ``"teacher"`` or ``"student"``), the file opened once; a one-line
    ``ValueError`` naming the file (or its ``config.json``) when it cannot be read, holds no backbone,
    disagrees with its config or holds NaN / inf weights."""
    loaded = load_checkpoint(source)
    container, entries = backbone_entries(loaded, which, source)
    config = transformers_config(source)
    if config is not None and (
        disagreement := config_disagreement(config[1], entries) or dinov3_config_disagreement(config[1], entries)
    ):
        raise ValueError(f"{config[0]}: {disagreement} (does this config.json belong to these weights?)")
    try:
        state_dict = _finite(to_timm_keys(entries), source)
    except ValueError as err:  # a layout's renaming names keys, not the file
        raise err if str(err).startswith(source) else ValueError(f"{source}: {err}") from err
    proj = state_dict.get("patch_embed.proj.weight")  # [D, 3, p, p]: a patch-8 run is rebuilt at its patch
    return BackboneFile(
        source=source,
        container=container,
        state_dict=state_dict,
        config=config,
        pos_embed_rule=exported_pos_embed_rule(loaded) or _container_pos_embed_rule(container, state_dict),
        patch=(int(proj.shape[-2]), int(proj.shape[-1])) if proj is not None and proj.ndim == 4 else None,
        grid=_trained_grid(state_dict),
    )


def _trained_grid(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, int] | None:
    """The square grid behind the file's ``pos_embed`` ``[1, P + N, D]``: the first of no prefix token
    (timm's ``no_embed_class``), the class token, the class and register tokens that leaves a square
    ``N``; None without ``pos_embed`` or a square."""
    pos_embed = state_dict.get("pos_embed")
    if pos_embed is None or pos_embed.ndim != 3:
        return None
    cls = int("cls_token" in state_dict)
    regs = state_dict.get("reg_token", state_dict.get("register_tokens"))
    for prefix in dict.fromkeys((0, cls, cls + (0 if regs is None else int(regs.shape[1])))):
        side = math.isqrt(max(pos_embed.shape[1] - prefix, 0))
        if side and side * side == pos_embed.shape[1] - prefix:
            return side, side
    return None
