"""What ``write_shards`` can read: an image folder, a VOC tree, an ADE20K tree, the built-in scenes.

A source lists cheap, picklable work ``items()`` in a fixed order and turns one item into one
webdataset sample in ``sample(item)`` (run in worker processes). Samples carry the original
encoded bytes (no re-encoding, no quality loss) under their format's key (``jpg``, ``png``, ...),
the class index as ``cls`` for class-folder trees, and the label map as ``seg.png`` for
segmentation sets. ``metadata()`` goes into the shard index (class names, ignore index).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from locatdino.data.ade20k import ADE20K_CLASSES, ADE20K_IGNORE_INDEX, ade20k_pairs
from locatdino.data.decode import IMAGE_SUFFIXES
from locatdino.data.scenes import SCENE_CLASSES, render_scene, scene_class, scene_classes, scene_rng
from locatdino.data.voc import VOC_CLASSES, VOC_IGNORE_INDEX, voc_pairs

Sample = dict[str, Any]


class ShardSource(Protocol):
    kind: str

    def items(self) -> list[Any]: ...

    def sample(self, item: Any) -> Sample: ...

    def metadata(self) -> dict[str, Any]: ...


def _key(text: str) -> str:
    """A webdataset key: no dots (the key ends at the first dot of a tar member's base name)."""
    return text.replace(".", "_").replace("\\", "/")


def _segmentation(names: tuple[str, ...], ignore_index: int | None) -> dict[str, Any]:
    return {"segmentation": {"num_classes": len(names), "ignore_index": ignore_index, "class_names": list(names)}}


@dataclass
class FolderSource:
    """Every image below ``root`` (recursive). If ``root`` holds only sub-folders, each top-level
    sub-folder is a class (as in ``torchvision.datasets.ImageFolder``) and samples get ``cls``."""

    root: Path
    kind: str = "folder"

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        self._files = sorted(p.relative_to(self.root) for p in self.root.rglob("*")
                             if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not self._files:
            raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) under {self.root}")
        nested = all(len(p.parts) > 1 for p in self._files)
        self.classes = sorted({p.parts[0] for p in self._files}) if nested else None

    def items(self) -> list[tuple[str, int | None]]:
        index = {c: i for i, c in enumerate(self.classes or [])}
        return [(p.as_posix(), index.get(p.parts[0]) if self.classes else None) for p in self._files]

    def sample(self, item: tuple[str, int | None]) -> Sample:
        rel, cls = item
        path = self.root / rel
        ext = path.suffix.lower()[1:]
        out: Sample = {"__key__": _key(rel[: -len(path.suffix)]), "jpg" if ext == "jpeg" else ext: path.read_bytes()}
        if cls is not None:
            out["cls"] = str(cls)
        return out

    def metadata(self) -> dict[str, Any]:
        return {"classes": self.classes}


@dataclass
class PairSource:
    """Image + mask pairs of a segmentation benchmark (``kind`` "voc" or "ade20k")."""

    root: Path
    split: str
    kind: str

    def __post_init__(self) -> None:
        finder = {"voc": voc_pairs, "ade20k": ade20k_pairs}[self.kind]
        self._pairs = [(str(i), str(m)) for i, m in finder(self.root, self.split)]

    def items(self) -> list[tuple[str, str]]:
        return self._pairs

    def sample(self, item: tuple[str, str]) -> Sample:
        image, mask = map(Path, item)
        return {"__key__": _key(image.stem), "jpg": image.read_bytes(), "seg.png": mask.read_bytes()}

    def metadata(self) -> dict[str, Any]:
        if self.kind == "voc":
            return _segmentation(VOC_CLASSES, VOC_IGNORE_INDEX)
        return _segmentation(ADE20K_CLASSES, ADE20K_IGNORE_INDEX)


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
        return {"__key__": f"scene_{self.split}_{self.seed}_{item:08d}", "jpg": jpg.getvalue(),
                "seg.png": png.getvalue(), "cls": str(scene_class(mask)),
                MULTILABEL_KEY: json.dumps(scene_classes(mask, self.multilabel_share))}

    def metadata(self) -> dict[str, Any]:
        return {**_segmentation(SCENE_CLASSES, None), "classes": list(SCENE_CLASSES), "seed": self.seed,
                "size": self.size, "split": self.split, "multilabel_share": self.multilabel_share}


def build_source(source: str | Path, kind: str = "auto", split: str | None = None, synthetic: int = 0,
                 seed: int = 0, size: int = 224) -> ShardSource:
    """Pick the source: ``kind`` in auto/folder/voc/ade20k/scenes (auto looks at the tree)."""
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
        else:
            kind = "folder"
    if kind == "folder":
        return FolderSource(root)
    if kind in ("voc", "ade20k"):
        return PairSource(root, split or {"voc": "train", "ade20k": "training"}[kind], kind)
    raise ValueError(f"unknown source kind {kind!r} (auto, folder, voc, ade20k, scenes)")
