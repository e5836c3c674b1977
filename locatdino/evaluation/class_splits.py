"""Image-labelled train / validation splits for classification on frozen class tokens
(``locatdino knn``, ``locatdino lincls``).

Three sources, each ``ds[i] -> (PIL RGB image, class index)`` with every label known before any
image is decoded (so a split that cannot be scored is refused before the long work):

- ``imagefolder``: ``ROOT/<split>/<class>/<image>``, classes sorted by folder name and images
  listed as torchvision's ``ImageFolder`` does (its extensions, its order, links followed), but each
  real file once (:func:`~locatdino.data.image_files.image_files`: a link loop is not walked again);
- ``shard-splits``: ``ROOT/<split>/`` of ``locatdino shards`` of such a tree (a ``cls`` per sample and
  the class names in ``index.json``), the supervised recipe's format;
- ``scenes``: the built-in scenes, one class per scene (its dominant object), as ``compare``.

The train split's classes are the classes; validation labels are mapped to them *by name*, since
a validation tree with fewer class folders numbers them differently. A validation class that has
no train image cannot be predicted, so it is refused, as is an empty class folder, a train split
of fewer than 2 classes (every image is then "right": top-1 100 % says nothing) and a validation
split that is the train split (each image would find itself).

Errors name the options as the user set them: a command's flags (``--data-dir``), or a
callback's arguments in ``fit``'s config (``KnnMonitor init_args.data_dir``): :class:`SplitOptions`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from locatdino.data.image_files import image_files
from locatdino.data.transforms.decode import decode_rgb

CLASS_DATASETS = ("imagefolder", "shard-splits", "scenes")


@dataclass(frozen=True)
class SplitOptions:
    """What the options choosing the splits are called where the user set them (in messages)."""

    dataset: str = "--dataset"
    data_dir: str = "--data-dir"
    train_split: str = "--train-split"
    val_split: str = "--val-split"
    num_train: str = "--num-train"
    num_val: str = "--num-val"

    @classmethod
    def init_args(cls, owner: str) -> SplitOptions:
        """The names of a callback's arguments in ``fit``'s config: ``KnnMonitor init_args.data_dir``."""
        return cls(**{f.name: f"{owner} init_args.{f.name}" for f in fields(cls)})


FLAGS = SplitOptions()


@dataclass
class LabelledImages:
    """``ds[i] -> (PIL image, label)`` of ``len(labels)`` images; ``name(i)`` says where image
    ``i`` comes from (a path, a shard member), so an image that does not decode can be named."""

    labels: np.ndarray
    class_names: list[str]
    load: Callable[[int], Image.Image]
    name: Callable[[int], str]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.load(i), int(self.labels[i])

    def subset(self, indices: np.ndarray) -> LabelledImages:
        indices = np.asarray(indices)
        return LabelledImages(
            self.labels[indices],
            self.class_names,
            lambda i: self.load(int(indices[i])),
            lambda i: self.name(int(indices[i])),
        )


def _image_folder(root: Path, names: SplitOptions) -> LabelledImages:
    """``root/<class>/<image>`` as ``ImageFolder`` lists it, each real file once (one walk of
    ``root``: a link from one class into another is not walked again); an empty class folder is
    refused."""
    if not root.is_dir():
        raise ValueError(f"{names.data_dir}: {root} is not a folder (expected ROOT/<split>/<class>/<image>)")
    try:
        classes, class_to_idx = find_classes(root)
    except FileNotFoundError:
        raise ValueError(f"{names.data_dir}: {root} holds no class folder (expected {root}/<class>/<image>)") from None
    found = [(str(p), class_to_idx.get(p.relative_to(root).parts[0])) for p in image_files(root, IMG_EXTENSIONS)]
    samples = sorted(((path, label) for path, label in found if label is not None), key=lambda s: s[1])  # stable
    counts = np.bincount([label for _, label in samples], minlength=len(classes))
    if (counts == 0).any():
        empty = [classes[c] for c in np.flatnonzero(counts == 0)]
        raise ValueError(
            f"class folder {root / empty[0]} holds no image ({', '.join(IMG_EXTENSIONS)})"
            + (f", nor do {len(empty) - 1} more" if len(empty) > 1 else "")
        )
    paths = [path for path, _ in samples]
    return LabelledImages(
        np.array([label for _, label in samples], np.int64), classes, lambda i: decode_rgb(paths[i]), lambda i: paths[i]
    )


def _shards(root: Path, names: SplitOptions) -> LabelledImages:
    from locatdino.data.shards.labels import ShardImageLabels

    if not root.is_dir():
        raise ValueError(f"{names.data_dir}: {root} is not a folder of shards (expected ROOT/<split>/*.tar)")
    shards = ShardImageLabels(str(root))
    labels = np.array([shards.label(i) for i in range(len(shards))], np.int64)
    return LabelledImages(labels, shards.class_names, lambda i: shards[i][0], shards.sample_name)


def _scenes(split: str, count: int, size: int, seed: int) -> LabelledImages:
    from locatdino.data import ScenesSegmentation
    from locatdino.data.scenes import SCENE_CLASSES, scene_class

    scenes = [ScenesSegmentation(count, size=size, seed=seed, split=split)[i] for i in range(count)]
    labels = np.array([scene_class(np.asarray(mask)) for _, mask in scenes], np.int64)
    return LabelledImages(labels, list(SCENE_CLASSES), lambda i: scenes[i][0], lambda i: f"{split} scene {i}")


def open_class_split(
    dataset: str,
    data_dir: str | None,
    split: str,
    count: int | None,
    seed: int,
    scene_size: int,
    default_scenes: int,
    option: str,
    names: SplitOptions = FLAGS,
) -> LabelledImages:
    """Split ``split`` of ``dataset``, limited to a seeded random subset of ``count`` images
    (scenes: ``count`` scenes are rendered, ``default_scenes`` when None); a ``count`` above the
    split's size is refused naming ``option``, the other options named as ``names`` says."""
    if dataset == "shards":
        raise ValueError(
            f"{names.dataset} 'shards' is a URL pattern of segmentation shards; class-labelled shards in "
            f"ROOT/<split>/*.tar are {names.dataset} shard-splits"
        )
    if dataset not in CLASS_DATASETS:
        raise ValueError(f"{names.dataset} {dataset!r}: not one of {', '.join(CLASS_DATASETS)}")
    if dataset == "scenes":
        return _scenes(split, count or default_scenes, scene_size, seed)
    if data_dir is None:
        raise ValueError(f"{names.dataset} {dataset} needs {names.data_dir} ROOT (ROOT/{split}/...)")
    images = (_image_folder if dataset == "imagefolder" else _shards)(Path(data_dir) / split, names)
    if count is not None and count > len(images):
        raise ValueError(
            f"{option} {count}: split {split!r} has only {len(images)} images (ask for at most "
            f"{len(images)}, or leave {option} out to use them all)"
        )
    if count is not None and count < len(images):
        images = images.subset(np.sort(np.random.default_rng(seed).choice(len(images), size=count, replace=False)))
    return images


def align_classes(
    train: LabelledImages, val: LabelledImages, val_split: str, option: str = FLAGS.val_split
) -> LabelledImages:
    """``val`` with its labels renumbered as the train split's classes (by name); ``ValueError``
    naming the first validation class without a train image (and ``option``)."""
    index = {name: i for i, name in enumerate(train.class_names)}
    present = np.bincount(train.labels, minlength=len(train.class_names)) > 0
    val_names = [val.class_names[c] for c in np.unique(val.labels)]
    missing = [name for name in val_names if name not in index or not present[index[name]]]
    if missing:
        raise ValueError(
            f"{option} {val_split}: class {missing[0]!r} has no train image"
            + (f" (nor do {len(missing) - 1} more)" if len(missing) > 1 else "")
            + ": a k-NN can never predict it"
        )
    relabel = np.array([index.get(name, -1) for name in val.class_names], np.int64)
    return LabelledImages(relabel[val.labels], train.class_names, val.load, val.name)


def _same_split(dataset: str, data_dir: str | None, train_split: str, val_split: str) -> bool:
    """Whether the two split names lead to the same images (the same folder, however written)."""
    if dataset == "scenes" or data_dir is None:
        return train_split == val_split
    return os.path.realpath(Path(data_dir) / train_split) == os.path.realpath(Path(data_dir) / val_split)


def open_labelled_splits(
    dataset: str,
    data_dir: str | None,
    splits: tuple[str, str],
    counts: tuple[int | None, int | None],
    seed: int,
    scene_size: int,
    default_scenes: tuple[int, int] = (300, 100),
    names: SplitOptions = FLAGS,
) -> tuple[LabelledImages, LabelledImages]:
    """The train and validation splits ``splits``, validation labels numbered as the train split's
    classes; refused (``ValueError`` naming ``names``' options) when the validation split is the
    train split or the train images hold fewer than 2 classes, before any image is decoded."""
    train_split, val_split = splits
    if _same_split(dataset, data_dir, train_split, val_split):
        raise ValueError(
            f"{names.val_split} {val_split} is the train split ({names.train_split} {train_split}): each "
            "validation image would find itself among the train images; score another split"
        )
    common = {"seed": seed, "scene_size": scene_size, "names": names}
    train = open_class_split(
        dataset, data_dir, train_split, counts[0], default_scenes=default_scenes[0], option=names.num_train, **common
    )
    present = np.unique(train.labels)
    if len(present) < 2:
        only = f" ({train.class_names[present[0]]!r})" if len(present) else ""
        raise ValueError(
            f"{names.train_split} {train_split}: its {len(train)} image{'s' * (len(train) != 1)} "
            f"hold{'s' * (len(train) == 1)} {len(present)} class{only}: "
            "classification needs at least 2 (with one, every image is right)"
        )
    val = open_class_split(
        dataset, data_dir, val_split, counts[1], default_scenes=default_scenes[1], option=names.num_val, **common
    )
    return train, align_classes(train, val, val_split, names.val_split)


def open_class_splits(args: Any) -> tuple[LabelledImages, LabelledImages]:
    """The train (``--train-split``) and validation (``--val-split``) splits of a command's data
    options (``locatdino.evaluation.options.add_data_arguments``), as :func:`open_labelled_splits`
    opens them: ``knn`` and ``lincls`` read them alike."""
    return open_labelled_splits(
        args.dataset,
        args.data_dir,
        (args.train_split, args.val_split),
        (args.num_train, args.num_val),
        args.seed,
        args.scene_size,
    )


def note_skipped(command: str, split: str, names: list[str]) -> None:
    """Say on stderr how many ``split`` images did not decode, naming the first three (``results.json`` names all)."""
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        print(
            f"[{command}] skipped {len(names)} {split} image{'s' * (len(names) != 1)} that do not decode: {shown} "
            "(all named in results.json)",
            file=sys.stderr,
            flush=True,
        )


def split_record(images: LabelledImages) -> dict[str, Any]:
    """What a ``results.json`` keeps of a split: its size and class count."""
    return {"images": len(images), "classes": len(np.unique(images.labels))}
