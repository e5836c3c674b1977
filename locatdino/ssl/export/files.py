"""The files ``locatdino export`` writes, and how it knows them again.

Three formats, each readable without this package:

- ``pth``: ``torch.save`` of the backbone's state dict (timm key names). Read by
  ``torch.load(OUT, weights_only=True)`` and ``load_state_dict``.
- ``safetensors``: OUT (``*.safetensors``, the suffix by which timm picks its reader) plus
  ``<stem>.config.json`` beside it, timm's Hugging Face ``config.json`` (``architecture``,
  ``model_args`` with the image and patch size, ``pretrained_cfg``): ``timm.create_model(
  cfg["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=OUT), **cfg["model_args"])``.
  A sidecar named after OUT, so two exports in one folder never share a ``config.json``.
- ``hf-hub``: a folder laid out as timm's Hub repos are (``model.safetensors``, ``config.json``,
  ``README.md``): ``timm.create_model("local-dir:OUT", pretrained=True)``, or push it as it is.

Every file carries the same metadata (:data:`EXPORT_KEY`: what was exported, from which file (its
name only: exports are pushed and shared, a local path is not theirs to publish), model name, image
and patch size, objective): in the safetensors header, in ``config.json``, as the model card's
last line (an HTML comment), and in the ``.pth`` state dict's ``_metadata`` (the slot torch keeps
module versions in, saved and loaded with the tensors and ignored by ``load_state_dict`` for any
name that is not a module).
:func:`export_metadata` reads it back, so an earlier export is told from any other file by what
export wrote into it, never by its shape.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import save_for_hf
from torch import nn

from locatdino.common.output_files import atomic_write, atomic_write_text
from locatdino.models.checkpoints.contents import EXPORT_KEY, WRITTEN_BY

FORMATS = ("pth", "safetensors", "hf-hub")
HUB_WEIGHTS, HUB_CONFIG, HUB_CARD = "model.safetensors", "config.json", "README.md"
_CARD_MARK = re.compile(r"<!-- (\{.*\}) -->")


def output_files(out: str | os.PathLike, fmt: str) -> list[Path]:
    """The files ``fmt`` writes for the output ``out``, in the order they are written."""
    out = Path(out)
    if fmt == "hf-hub":
        return [out / HUB_WEIGHTS, out / HUB_CONFIG, out / HUB_CARD]
    if fmt == "safetensors":
        return [out, sidecar_config(out)]
    return [out]


def sidecar_config(out: str | os.PathLike) -> Path:
    """``teacher.config.json`` for ``teacher.safetensors``."""
    return Path(out).with_suffix(".config.json")


def export_metadata(path: str | os.PathLike) -> dict[str, str] | None:
    """The metadata export wrote into ``path`` (a ``.pth``, ``.safetensors``, ``config.json`` or model
    card of an earlier export), or None for any other file or one that cannot be read: only what is
    written inside counts, never the file's name or shape."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            with safetensors.safe_open(path, framework="pt") as f:
                found = {k: v for k, v in (f.metadata() or {}).items() if k != "format"}  # safetensors' own key
        elif path.suffix == ".json":
            found = json.loads(path.read_text(encoding="utf-8")).get(EXPORT_KEY) or {}
        elif path.name == HUB_CARD:
            found = _card_metadata(path)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            found = (getattr(obj, "_metadata", None) or {}).get(EXPORT_KEY) or {}
    except Exception:  # noqa: BLE001 - a file that cannot be read holds no metadata of ours
        return None
    return dict(found) if isinstance(found, Mapping) and found.get("written_by") == WRITTEN_BY else None


def _card_metadata(path: Path) -> object:
    """The metadata in a model card's last line (:func:`with_card_mark`), or None."""
    lines = path.read_text(encoding="utf-8").rstrip("\n").rsplit("\n", 1)
    match = _CARD_MARK.fullmatch(lines[-1])
    return json.loads(match.group(1)).get(EXPORT_KEY) if match else None


def with_card_mark(card: str, metadata: Mapping[str, str]) -> str:
    """``card`` with the export's metadata as its last line, an HTML comment the Hub does not show."""
    found = json.dumps({EXPORT_KEY: dict(metadata)}).replace(">", "\\u003e")  # never ends the comment
    return f"{card.rstrip()}\n\n<!-- {found} -->\n"


def describe_export(metadata: Mapping[str, str]) -> str:
    """``"the vit_tiny_patch16_224 teacher of last.ckpt, step 80"``."""
    step = f", step {metadata['step']}" if metadata.get("step") else ""
    what = " ".join(v for v in (metadata.get("model"), metadata.get("network")) if v) or "backbone"
    return f"the {what} of {metadata.get('source', 'a checkpoint')}{step}"


def write_pth(state: Mapping[str, torch.Tensor], metadata: Mapping[str, str], out: Path) -> None:
    """``torch.save`` of ``state`` with ``metadata`` in its ``_metadata`` (atomic)."""
    saved = OrderedDict(state)
    saved._metadata = {**getattr(state, "_metadata", {}), EXPORT_KEY: dict(metadata)}
    atomic_write(out, lambda f: torch.save(saved, f))


def write_safetensors(state: Mapping[str, torch.Tensor], metadata: Mapping[str, str], out: Path) -> None:
    """The tensors and ``metadata`` (``format: pt``, as transformers and timm expect) as safetensors."""
    data = safetensors.torch.save(dict(state), metadata={"format": "pt", **metadata})
    atomic_write(out, lambda f: f.write(data))


def timm_config(model: nn.Module, metadata: Mapping[str, str]) -> str:
    """timm's ``config.json`` of ``model`` (timm's public ``save_for_hf``: architecture and the
    model arguments timm rebuilds it from), at its build size with ImageNet normalisation (what
    ``fit`` trains with), without the pretrained tag of timm's own weights, plus the export's
    metadata. ``save_for_hf`` also writes the weights, without the export's metadata: that copy
    stays in a temporary folder, and :func:`write_safetensors` writes the one shipped."""
    with tempfile.TemporaryDirectory() as folder:
        save_for_hf(model, folder, safe_serialization=True)
        config = json.loads((Path(folder) / HUB_CONFIG).read_text(encoding="utf-8"))
    pretrained = config["pretrained_cfg"]
    pretrained.pop("tag", None)
    pretrained.update(
        input_size=[3, *model.patch_embed.img_size], mean=list(IMAGENET_DEFAULT_MEAN), std=list(IMAGENET_DEFAULT_STD)
    )
    config[EXPORT_KEY] = dict(metadata)
    return json.dumps(config, indent=2) + "\n"


def write_export(
    fmt: str,
    state: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str],
    out: Path,
    model: nn.Module | None = None,
    card: str = "",
) -> list[Path]:
    """Write ``state`` in ``fmt`` to ``out`` (``model``: what ``state`` loads into, for
    ``config.json``; ``card``: the hf-hub ``README.md``); returns the files written. Each file is
    written atomically; the weights first, so a ``config.json`` never describes absent weights."""
    files = output_files(out, fmt)
    if fmt == "pth":
        write_pth(state, metadata, out)
        return files
    if model is None:
        raise ValueError(f"--format {fmt} needs the model the weights are for")
    write_safetensors(state, metadata, files[0])
    atomic_write_text(files[1], timm_config(model, metadata))
    if fmt == "hf-hub":
        atomic_write_text(files[2], with_card_mark(card, metadata))
    return files
