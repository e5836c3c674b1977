"""``locatdino export CKPT OUT``: a checkpoint's backbone as files timm loads without this package.

Formats (``--format``; :mod:`locatdino.ssl.export.files`): ``pth``, a ``torch.save``'d timm state dict
(the default, except for an OUT named ``*.safetensors``); ``safetensors``, OUT plus a timm
``<stem>.config.json``; ``hf-hub``, a folder laid out as timm's Hugging Face Hub repos
(``model.safetensors``, ``config.json``, a ``README.md`` model card with the run's recipe, step and
logged scores). Only the backbone's tensors under timm's key names (``blocks.*.attn.gaug.*`` for
LocAtViT), no head, no optimizer, no Python objects.

Input: a ``fit`` checkpoint (the backbone its hyper-parameters describe), or any other file
``locatdino.models.create_backbone`` reads, written ``NAME:FILE`` (the ``--model`` grammar of the
evaluation commands) so the weights are loaded into the model they are for; a ``pth`` export of a
file given without NAME keeps the keys as found. The weights always load ``strict=True`` before
anything is written. Files are written atomically, never over the input checkpoint or a file export
did not write, and over an earlier export only with ``--overwrite`` (docs/commands.md's one rule: an
earlier export is recognised by the metadata export writes into every file, the model card included).
A Hugging Face model folder is read through its weights file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from timm.models import split_model_name_tag
from torch import nn

import locatdino
from locatdino.common.arguments import ArgumentParser, option_groups
from locatdino.common.output_files import DiskFullError, remove_stale_temporaries
from locatdino.models import create_backbone, extract_backbone, load_checkpoint
from locatdino.models.checkpoints.contents import network_name
from locatdino.models.checkpoints.hugging_face import weights_in_folder
from locatdino.models.model_spec import parse_model
from locatdino.models.token_grid import patch_size
from locatdino.ssl.export.files import FORMATS, WRITTEN_BY, describe_export, export_metadata, output_files, write_export
from locatdino.ssl.export.model_card import logged_evaluation, model_card


def export_backbone(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    which: str = "teacher",
    overwrite: bool = False,
    fmt: str | None = None,
) -> str:
    """Write the ``which`` backbone of ``checkpoint`` (a file, or ``NAME:FILE``) to ``out`` in
    ``fmt`` (None: from ``out``'s suffix); return a one-line summary."""
    name, source = _model_and_file(os.fspath(checkpoint))
    fmt = export_format(os.fspath(out), fmt)
    files = output_files(out, fmt)
    # a Hugging Face model folder is read through its weights file (which is then the input)
    _check_targets(weights_in_folder(source) if os.path.isdir(source) else source, Path(out), files, fmt, overwrite)
    ckpt = load_checkpoint(source, mmap=True)  # metadata; the weights are read by create_backbone
    lightning = isinstance(ckpt, Mapping) and "pytorch-lightning_version" in ckpt
    hparams = (ckpt.get("hyper_parameters") or {}) if lightning else {}
    name, kwargs = _architecture(name, hparams, source)
    model: nn.Module | None = None
    if name is not None:
        model = create_backbone(name, source, which, **kwargs)
        state: Mapping[str, torch.Tensor] = model.state_dict()
    elif fmt == "pth":
        state = {k: v.contiguous() for k, v in extract_backbone(ckpt, which, source).items()}
    else:
        raise ValueError(
            f"{source}: --format {fmt} writes the model's config, so name the model the weights are "
            f"for: NAME:{source} (e.g. vit_small_patch16_224:{source})"
        )
    network = network_name(ckpt, which) if isinstance(ckpt, Mapping) else which
    metadata = _metadata(source, network, model, hparams, ckpt, lightning)
    card = ""
    if fmt == "hf-hub":
        step = ckpt.get("global_step") if lightning else None
        card = model_card(metadata, hparams, logged_evaluation(source, step), ckpt.get("epoch") if lightning else None)
    for folder in {f.parent for f in files}:
        remove_stale_temporaries(folder)  # of an export killed mid-write
    write_export(fmt, state, metadata, Path(out), model, card)
    params = sum(v.numel() for v in state.values())
    what = f"{network} {metadata['model']} backbone" if model is not None else f"{network} backbone"
    return (
        f"wrote the {what} ({len(state)} tensors, {params / 1e6:.2f}M values) to {', '.join(map(str, files))} ({fmt})"
    )


def export_format(out: str, fmt: str | None) -> str:
    """``fmt``, or the one OUT's name asks for; ``ValueError`` when the name would make timm read
    the file with the wrong reader (it picks safetensors by the suffix)."""
    named_safetensors = Path(out).suffix == ".safetensors"
    if fmt is None:
        return "safetensors" if named_safetensors else "pth"
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "safetensors" and not named_safetensors:
        raise ValueError(
            f"the output {out}: --format safetensors writes a .safetensors file (timm picks its reader "
            f"by the suffix): name it {Path(out).with_suffix('.safetensors')}"
        )
    if fmt != "safetensors" and named_safetensors:
        raise ValueError(
            f"the output {out} is named .safetensors but --format {fmt} writes "
            f"{'a folder' if fmt == 'hf-hub' else 'a torch file'}: choose another name"
        )
    return fmt


def _model_and_file(text: str) -> tuple[str | None, str]:
    """``(NAME, FILE)`` of ``NAME:FILE``, ``(None, FILE)`` of a plain path (a path holding ``:``
    counts as a path when it exists)."""
    if os.path.lexists(text) or ":" not in text:
        return None, text
    label, name, source = parse_model(text)
    if label is not None or source is None:
        raise ValueError(f"{text!r}: expected a checkpoint file or NAME:FILE (e.g. vit_small_patch16_224:dino.pth)")
    return name, source


def _architecture(name: str | None, hparams: Mapping[str, Any], source: str) -> tuple[str | None, dict[str, Any]]:
    """The model and ``create_backbone`` arguments the weights are loaded into: a ``fit``
    checkpoint's hyper-parameters (a NAME given too must agree), else NAME (or None)."""
    saved = hparams.get("backbone")
    if saved is None:
        return name, {}
    saved = split_model_name_tag(saved)[0]  # a pretrained tag named the student's first weights
    if name is not None and split_model_name_tag(name)[0] != saved:
        raise ValueError(f"{source} holds a {saved} backbone, not {name}: leave the name out for a fit checkpoint")
    return saved, dict(hparams.get("backbone_kwargs") or {})


def _metadata(
    source: str, network: str, model: nn.Module | None, hparams: Mapping[str, Any], ckpt: Any, lightning: bool
) -> dict[str, str]:
    """What every exported file records (strings: the safetensors header holds nothing else)."""
    found: dict[str, str] = {
        "written_by": WRITTEN_BY,
        "locatdino_version": locatdino.__version__,
        "source": os.path.basename(os.path.normpath(source)),  # its name only: the files get pushed and shared
        "network": network,
    }
    if model is not None:
        img, patch = model.patch_embed.img_size, patch_size(model)
        found.update(
            model=model.pretrained_cfg["architecture"],
            img_size=str(img[0]) if img[0] == img[1] else f"{img[0]}x{img[1]}",
            patch_size=str(patch[0]) if patch[0] == patch[1] else f"{patch[0]}x{patch[1]}",
            pos_embed_rule=getattr(model, "pos_embed_rule", "timm"),
        )
    if lightning:
        found["objective"] = hparams.get("_class_path") or f"locatdino fit ({network})"
        found["step"] = str(ckpt.get("global_step", ""))
    elif isinstance(ckpt, Mapping) and "student" in ckpt and "teacher" in ckpt:
        found["objective"] = "DINO (a student/teacher training checkpoint)"
        if isinstance(ckpt.get("epoch"), int):
            found["epoch"] = str(ckpt["epoch"])
    return found


def _check_targets(source: str, out: Path, files: list[Path], fmt: str, overwrite: bool) -> None:
    """``ValueError`` when writing ``files`` would lose something export was not asked to replace:
    the input checkpoint (always, also through a symbolic or hard link), a folder, link or file
    export did not write (always: docs/commands.md's rule), an earlier export (unless ``overwrite``;
    recognised by the metadata export writes into every file)."""
    if fmt == "hf-hub" and os.path.lexists(out) and not out.is_dir():
        raise ValueError(f"the output {out} is a file: --format hf-hub writes a folder, give a folder name")
    if fmt != "hf-hub" and out.is_dir():
        raise ValueError(f"the output {out} is a folder: give a file name, or --format hf-hub to write a Hub folder")
    other = "folder" if fmt == "hf-hub" else "file"
    for path in files:
        if not os.path.lexists(path):
            continue
        if os.path.exists(source) and path.exists() and os.path.samefile(source, path):  # also a link of it
            raise ValueError(f"the output {path} is the input checkpoint: write the export to another {other}")
        if path.is_dir():
            raise ValueError(f"the output {path} is a folder, where export writes a file: choose another {other}")
        if not path.exists():  # a link to nothing
            raise ValueError(
                f"the output {path} is a link to a missing file {os.readlink(path)}, not an earlier export: "
                f"remove the link, or choose another {other}"
            )
        earlier = export_metadata(path)
        if earlier is None:
            raise ValueError(
                f"the output {path} exists and was not written by export, which never replaces such a file: "
                f"choose another {other}"
            )
        if not overwrite:
            raise ValueError(
                f"the output {path} is an earlier export ({describe_export(earlier)}): pass --overwrite to "
                f"replace it, or choose another {other}"
            )


def main(argv: list[str]) -> int:
    """``locatdino export`` with ``argv`` (without the word ``export``); returns the exit status."""
    parser = ArgumentParser(prog="locatdino export", description=__doc__.split("\n\n")[0])
    groups = option_groups(parser)
    groups.model.add_argument(
        "checkpoint",
        metavar="[NAME:]CHECKPOINT",
        help="Lightning checkpoint of locatdino fit (runs/<run>/checkpoints/last.ckpt), or "
        "NAME:FILE for any other file locatdino reads (a DINO checkpoint, a released "
        "backbone), NAME the timm / LocAtViT model the weights are for",
    )
    groups.model.add_argument(
        "--which",
        choices=("teacher", "student"),
        default="teacher",
        help="network to export (default: the one the objective evaluates: DINO's teacher, "
        "the supervised classifier's backbone)",
    )
    groups.output.add_argument("out", help="output file (pth, safetensors) or folder (hf-hub)")
    groups.output.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        dest="fmt",
        help="pth: a torch state dict; safetensors: OUT.safetensors and its timm "
        "<stem>.config.json; hf-hub: a folder timm loads as local-dir:OUT or from the Hub "
        "once pushed (default: safetensors for an OUT named *.safetensors, else pth)",
    )
    groups.output.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export (recognised by the metadata export writes into each file); a "
        "file export did not write, and the input checkpoint, are never replaced",
    )
    args = parser.parse_args(argv)
    try:
        print(export_backbone(args.checkpoint, args.out, args.which, args.overwrite, args.fmt))
    except (ValueError, FileNotFoundError, DiskFullError) as err:
        print(f"locatdino export: {err}", file=sys.stderr)
        return 1
    return 0
