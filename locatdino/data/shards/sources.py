"""What ``write_shards`` can read: an image folder, a VOC tree, an ADE20K tree, the built-in scenes.

A source lists cheap, picklable work ``items()`` in a fixed order and turns one item into one
webdataset sample in ``sample(item)`` (run in worker processes). Samples carry the original
encoded bytes (no re-encoding, no quality loss) under their format's key (``jpg``, ``png``, ...),
the class index as ``cls`` for class-folder trees, and the label map as ``seg.png`` for
segmentation sets. ``metadata()`` goes into the shard index (class names, ignore index).

What a reader gets is what the index counts: a file that does not decode (a text file named
``.jpg``, a zero-byte ``.png``) raises :class:`~locatdino.data.transforms.decode.DecodeError` naming it, and
the writer skips and counts it; sample keys are unique, because WebDataset groups consecutive tar
members of one key into one sample (``a.jpg`` + ``a.png``, or ``a.b.jpg`` + ``a_b.jpg``, would be
read as one): a file whose natural key is taken keeps its extension in its key (``a_png``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from locatdino.data.datasets.ade20k import ADE20K_CLASSES, ADE20K_IGNORE_INDEX, ade20k_pairs
from locatdino.data.datasets.cityscapes import (
    CITYSCAPES_CLASSES,
    CITYSCAPES_IGNORE_INDEX,
    cityscapes_pairs,
    is_label_id_mask,
    to_train_ids,
)
from locatdino.data.datasets.voc import VOC_CLASSES, VOC_IGNORE_INDEX, voc_pairs
from locatdino.data.image_files import image_files
from locatdino.data.scenes import SCENE_CLASSES, render_scene, scene_class, scene_classes, scene_rng
from locatdino.data.transforms.decode import IMAGE_SUFFIXES, DecodeError, decode_mask, decode_rgb

Sample = dict[str, Any]


class ShardSource(Protocol):
    kind: str

    def items(self) -> list[Any]: ...

    def sample(self, item: Any) -> Sample: ...

    def metadata(self) -> dict[str, Any]: ...


def _key(text: str) -> str:
    """A webdataset key: no dots (the key ends at the first dot of a tar member's base name)."""
    return text.replace(".", "_").replace("\\", "/")


def unique_keys(files: list[str]) -> tuple[list[str], dict[str, str]]:
    """A distinct webdataset key per file (relative paths, in writing order): the path without
    its extension, dots made underscores; a file whose key an earlier one has gets its
    extension appended (``a.png`` after ``a.jpg``: ``a_png``), then ``_2``, ``_3``... if needed.
    Returns the keys and ``{file: key}`` of the files that did not get their natural key."""
    natural = [_key(str(Path(f).with_suffix(""))) for f in files]
    taken, used, keys, renamed = set(natural), set(), [], {}
    for file, key in zip(files, natural):
        if key in used:
            base = key = f"{key}_{Path(file).suffix.lower()[1:]}"
            n = 1
            while key in taken:
                n += 1
                key = f"{base}_{n}"
            taken.add(key)
            renamed[file] = key
        used.add(key)
        keys.append(key)
    return keys, renamed


def _read(path: Path, check: Callable[[bytes], object], name: str) -> bytes:
    """The bytes of ``path`` once ``check`` decoded them; ``DecodeError`` naming ``name`` if not."""
    try:
        data = path.read_bytes()
        check(data)
    except (OSError, DecodeError) as exc:
        raise DecodeError(f"{name}: {exc}") from None
    return data


# decode as the shard stream will (a JPEG at libjpeg's 1/8 scale: its whole stream is still read)
_CHECK_IMAGE = partial(decode_rgb, draft=(1, 1))
_CHECK_PAIRED_IMAGE = partial(decode_rgb, upright=False, draft=(1, 1))  # masks label the stored grid


def _segmentation(names: tuple[str, ...], ignore_index: int | None) -> dict[str, Any]:
    return {"segmentation": {"num_classes": len(names), "ignore_index": ignore_index, "class_names": list(names)}}


@dataclass
class FolderSource:
    """Every image below ``root`` (recursive, symbolic links followed, each real file once:
    :func:`~locatdino.data.image_files.image_files`). If ``root`` holds only sub-folders, each
    top-level sub-folder is a class (as in ``torchvision.datasets.ImageFolder``) and samples get ``cls``."""

    root: Path
    kind: str = "folder"

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        self._files = sorted(p.relative_to(self.root) for p in image_files(self.root, IMAGE_SUFFIXES))
        if not self._files:
            raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {self.root}")
        nested = all(len(p.parts) > 1 for p in self._files)
        self.classes = sorted({p.parts[0] for p in self._files}) if nested else None
        self._keys, self.renamed = unique_keys([p.as_posix() for p in self._files])

    def items(self) -> list[tuple[str, str, int | None]]:
        index = {c: i for i, c in enumerate(self.classes or [])}
        return [
            (p.as_posix(), key, index.get(p.parts[0]) if self.classes else None)
            for p, key in zip(self._files, self._keys)
        ]

    def sample(self, item: tuple[str, str, int | None]) -> Sample:
        rel, key, cls = item
        path = self.root / rel
        ext = path.suffix.lower()[1:]
        out: Sample = {"__key__": key, "jpg" if ext == "jpeg" else ext: _read(path, _CHECK_IMAGE, rel)}
        if cls is not None:
            out["cls"] = str(cls)
        return out

    def metadata(self) -> dict[str, Any]:
        return {"classes": self.classes, **_renamed(self.renamed)}


def _renamed(renamed: dict[str, str], shown: int = 100) -> dict[str, Any]:
    """The index entry of files stored under another key than their natural one (none: no entry)."""
    if not renamed:
        return {}
    return {"renamed_keys": {"count": len(renamed), "first": dict(list(renamed.items())[:shown])}}


@dataclass
class PairSource:
    """Image + mask pairs of a segmentation benchmark (``kind`` "voc", "ade20k" or "cityscapes";
    Cityscapes' PNG images are kept as ``png``, its ``labelIds`` masks written as train ids)."""

    root: Path
    split: str
    kind: str

    def __post_init__(self) -> None:
        finder = {"voc": voc_pairs, "ade20k": ade20k_pairs, "cityscapes": cityscapes_pairs}[self.kind]
        pairs = finder(self.root, self.split)
        keys, self.renamed = unique_keys([i.name for i, _ in pairs])
        self._pairs = [(str(i), str(m), key) for (i, m), key in zip(pairs, keys)]

    def items(self) -> list[tuple[str, str, str]]:
        return self._pairs

    def sample(self, item: tuple[str, str, str]) -> Sample:
        image, mask, key = item
        seg = _read(Path(mask), decode_mask, mask)
        if is_label_id_mask(mask):
            out = io.BytesIO()
            Image.fromarray(to_train_ids(decode_mask(seg)), "L").save(out, format="PNG")
            seg = out.getvalue()
        return {
            "__key__": key,
            "png" if self.kind == "cityscapes" else "jpg": _read(Path(image), _CHECK_PAIRED_IMAGE, image),
            "seg.png": seg,
        }

    def metadata(self) -> dict[str, Any]:
        names, ignore = {
            "voc": (VOC_CLASSES, VOC_IGNORE_INDEX),
            "ade20k": (ADE20K_CLASSES, ADE20K_IGNORE_INDEX),
            "cityscapes": (CITYSCAPES_CLASSES, CITYSCAPES_IGNORE_INDEX),
        }[self.kind]
        return {**_segmentation(names, ignore), **_renamed(self.renamed)}


MULTILABEL_KEY = "classes.json"  # a sample's multi-label image-level label: a JSON list of class ids


@dataclass
class ScenesSource:
    """``num_images`` built-in scenes (JPEG quality 90 + exact PNG label map) with two image-level
    labels for supervised pretraining: ``cls``, the dominant object class (:func:`scene_class`),
    and ``classes.json``, every class covering at least ``multilabel_share`` of the pixels
    (:func:`scene_classes`). Training reads only the image and one of these, never ``seg.png``."""

    num_images: int
    seed: int = 0
    size: int = 224
    split: str = "train"
    kind: str = "scenes"
    multilabel_share: float = 0.05

    def items(self) -> list[int]:
        return list(range(self.num_images))

    def sample(self, item: int) -> Sample:
        image, mask = render_scene(scene_rng(self.seed, item, self.split), self.size)
        jpg, png = io.BytesIO(), io.BytesIO()
        Image.fromarray(image).save(jpg, format="JPEG", quality=90)
        Image.fromarray(np.ascontiguousarray(mask), "L").save(png, format="PNG")
        return {
            "__key__": f"scene_{self.split}_{self.seed}_{item:08d}",
            "jpg": jpg.getvalue(),
            "seg.png": png.getvalue(),
            "cls": str(scene_class(mask)),
            MULTILABEL_KEY: json.dumps(scene_classes(mask, self.multilabel_share)),
        }

    def metadata(self) -> dict[str, Any]:
        return {
            **_segmentation(SCENE_CLASSES, None),
            "classes": list(SCENE_CLASSES),
            "seed": self.seed,
            "size": self.size,
            "split": self.split,
            "multilabel_share": self.multilabel_share,
        }


def build_source(
    source: str | Path, kind: str = "auto", split: str | None = None, synthetic: int = 0, seed: int = 0, size: int = 224
) -> ShardSource:
    """Pick the source: ``kind`` in auto/folder/voc/ade20k/cityscapes/scenes (auto looks at the tree)."""
    if synthetic and (str(source) != "scenes" or kind not in ("auto", "scenes")):
        given = f"--kind {kind}" if str(source) == "scenes" else f"the source {source}"
        raise ValueError(f"--synthetic {synthetic} writes built-in scenes, but {given} was given too: drop one")
    if synthetic or kind == "scenes" or str(source) == "scenes":
        if synthetic <= 0:
            raise ValueError("built-in scenes need --synthetic N (number of images) > 0")
        return ScenesSource(synthetic, seed, size, split or "train")
    root = Path(source)
    if kind == "auto":
        if any((root / d / "JPEGImages").is_dir() for d in (".", "VOC2012", "VOCdevkit/VOC2012")):
            kind = "voc"
        elif any((root / d / "annotations").is_dir() for d in (".", "ADEChallengeData2016")):
            kind = "ade20k"
        elif any((root / d / "leftImg8bit").is_dir() for d in (".", "cityscapes", "Cityscapes")):
            kind = "cityscapes"  # without gtFine/ refused by the reader, never written as plain images
        else:
            kind = "folder"
    if kind == "folder":
        return FolderSource(root)
    if kind in ("voc", "ade20k", "cityscapes"):
        return PairSource(root, split or {"voc": "train", "ade20k": "training", "cityscapes": "train"}[kind], kind)
    raise ValueError(f"unknown source kind {kind!r} (auto, folder, voc, ade20k, cityscapes, scenes)")
