"""``locatdino export CKPT OUT``: a checkpoint's backbone as a plain timm state dict.

The output holds only the backbone's tensors under timm's key names (``cls_token``,
``blocks.0.attn.qkv.weight``, … plus ``blocks.*.attn.gaug.*`` for LocAtViT), no head, no
optimizer, no Python objects: ``torch.load(OUT, weights_only=True)`` reads it and
``timm.create_model(name, num_classes=0, ...).load_state_dict(...)`` or
``locatdino.models.create_backbone(name, checkpoint=OUT)`` loads it. Input: this project's
Lightning checkpoints, and any other container ``locatdino.models`` reads (full DINO training
checkpoints, …). For Lightning checkpoints the weights are first loaded, ``strict=True``, into
the backbone their hyper-parameters describe, so a broken export never gets written. The file is
written atomically, never over the input checkpoint, and over an existing file only when that is an
earlier export (a plain state dict of tensors) or ``--overwrite`` says so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from locatdino.arguments import ArgumentParser, option_groups
from locatdino.models import create_backbone, extract_backbone, load_checkpoint
from locatdino.models.checkpoints.loading import network_name
from locatdino.output_files import DiskFullError, remove_stale_temporaries
from locatdino.ssl.checkpoint_io import atomic_torch_save
from locatdino.errors import first_line


def export_backbone(checkpoint: str | os.PathLike, out: str | os.PathLike, which: str = "teacher",
                    overwrite: bool = False) -> str:
    """Write the ``which`` backbone of ``checkpoint`` to ``out``; return a one-line summary."""
    source = os.fspath(checkpoint)
    _check_target(source, os.fspath(out), overwrite)
    if os.path.isdir(source):
        raise ValueError(f"{source} is a directory (a sharded FSDP checkpoint?): save with the default "
                         "FSDPStrategy(state_dict_type='full') to get one file")
    ckpt = load_checkpoint(source)
    state = {k: v.contiguous() for k, v in extract_backbone(ckpt, which, source).items()}
    hparams = ckpt.get("hyper_parameters") if "pytorch-lightning_version" in ckpt else None
    described = _check_against_hparams(state, hparams, source) if hparams else "backbone"
    remove_stale_temporaries(Path(out).parent)  # of an export killed mid-write
    atomic_torch_save(state, out)
    params = sum(v.numel() for v in state.values())
    return f"wrote the {network_name(ckpt, which)} {described} ({len(state)} tensors, {params / 1e6:.2f}M values) to {os.fspath(out)}"


def _check_target(source: str, out: str, overwrite: bool) -> None:
    """``ValueError`` when writing ``out`` would lose something export did not write: the input
    checkpoint itself (always, also through a symbolic or hard link), another file or link unless
    ``overwrite``."""
    if not os.path.lexists(out):
        return
    if os.path.isdir(out):
        raise ValueError(f"the output {out} is a folder: give a file name")
    if os.path.exists(source) and os.path.exists(out) and os.path.samefile(source, out):  # also a link of it
        raise ValueError(f"the output {out} is the input checkpoint: write the export to another file")
    if not os.path.exists(out) and not overwrite:  # a link to nothing
        raise ValueError(f"the output {out} is a link to a missing file {os.readlink(out)}: pass --overwrite to "
                         f"replace the link by the export, or choose another file")
    if not overwrite and not _is_state_dict(out):
        raise ValueError(f"the output {out} exists and is not a state dict written by export: pass --overwrite "
                         f"to replace {out}, or choose another file")


def _is_state_dict(path: str) -> bool:
    """Whether ``path`` holds a plain ``{name: tensor}`` dict (what export writes), read lazily."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - anything torch cannot read is not an export
        return False
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _check_against_hparams(state: dict[str, torch.Tensor], hparams: Mapping[str, Any], source: str) -> str:
    name, kwargs = hparams["backbone"], dict(hparams.get("backbone_kwargs") or {})
    model = create_backbone(name, **kwargs)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{source}: the backbone weights do not load into {name}({kwargs}): "
                         f"{first_line(err)}") from err
    return f"{name} backbone" + (f" {kwargs}" if kwargs else "")


def main(argv: list[str]) -> int:
    """``locatdino export`` with ``argv`` (without the word ``export``); returns the exit status."""
    parser = ArgumentParser(prog="locatdino export", description=__doc__.split("\n\n")[0])
    groups = option_groups(parser)
    groups.model.add_argument("checkpoint", help="Lightning checkpoint of locatdino fit "
                              "(runs/<run>/checkpoints/last.ckpt) or DINO checkpoint")
    groups.model.add_argument("--which", choices=("teacher", "student"), default="teacher",
                              help="network to export (default: the one the objective evaluates: DINO's teacher, "
                              "the supervised classifier's backbone)")
    groups.output.add_argument("out", help="output .pth file (plain timm state dict)")
    groups.output.add_argument("--overwrite", action="store_true",
                               help="replace OUT even when it is not an earlier export (never the input checkpoint)")
    args = parser.parse_args(argv)
    try:
        print(export_backbone(args.checkpoint, args.out, args.which, args.overwrite))
    except (ValueError, FileNotFoundError, DiskFullError) as err:
        print(f"locatdino export: {err}", file=sys.stderr)
        return 1
    return 0
