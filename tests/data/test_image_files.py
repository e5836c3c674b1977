"""Image folders with symbolic links: each real file once, in ImageFolder's order, however the links run."""

import os

import numpy as np
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from locatdino.data.image_files import image_files
from locatdino.data.shards.sources import FolderSource
from locatdino.evaluation.class_splits import open_class_split


def _tree(root, classes=("a", "b", "c"), per_class=4):
    """``root/<class>/<i>.png``; returns the real paths written."""
    written = []
    for k, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (k, i, 0)).save(root / cls / f"{i}.png")
            written.append(str(root / cls / f"{i}.png"))
    return written


def _looped(tmp_path):
    """12 real images; a loop back to the split, a loop onto itself and a second link to a folder."""
    train = tmp_path / "data" / "train"
    written = _tree(train)
    (train / "a" / "loop").symlink_to("..")  # a/loop/a/loop/... : os.walk(followlinks=True) descends it 40 deep
    (train / "b" / "self").symlink_to(".")
    (train / "c" / "also-a").symlink_to(train / "a")
    (train / "c" / "dup.png").symlink_to(train / "b" / "0.png")  # a link to a file: the same image
    return train, written


def test_a_link_loop_lists_each_real_file_once_under_its_real_name(tmp_path):
    train, written = _looped(tmp_path)
    assert [str(p) for p in image_files(train, IMG_EXTENSIONS)] == sorted(written)


def test_the_order_is_image_folders_on_a_tree_without_links(tmp_path):
    """The independent references: os.walk's sorted listing, and torchvision's ImageFolder for the
    class splits (nested folders, names that sort differently as paths and as strings)."""
    root = tmp_path / "data" / "split"
    _tree(root, classes=("a", "a b", "a_c"), per_class=2)
    for sub in ("a/x", "a/x y", "a b/z"):
        (root / sub).mkdir()
        Image.new("RGB", (8, 8)).save(root / sub / "in.jpeg")
        (root / sub / "notes.txt").write_text("not an image")
    walked = [os.path.join(d, f) for d, _, files in sorted(os.walk(root)) for f in sorted(files) if f != "notes.txt"]
    assert [str(p) for p in image_files(root, IMG_EXTENSIONS)] == walked
    _, class_to_idx = find_classes(root)
    expected = make_dataset(root, class_to_idx, extensions=IMG_EXTENSIONS)
    images = open_class_split("imagefolder", str(root.parent), "split", None, 0, 224, 0, "--num-train")
    assert len(expected) == 9 and [(images.name(i), images.labels[i]) for i in range(9)] == expected
    assert [path for path, _ in expected] != walked  # the class order is not the path order here


def test_knn_and_lincls_read_a_looped_class_folder_as_its_12_images(tmp_path):
    train, written = _looped(tmp_path)
    images = open_class_split("imagefolder", str(tmp_path / "data"), "train", None, 0, 224, 0, "--num-train")
    assert len(images) == 12 and images.class_names == ["a", "b", "c"]
    assert np.array_equal(images.labels, np.repeat([0, 1, 2], 4))
    assert [images.name(i) for i in range(12)] == sorted(written)


def test_shards_of_a_looped_folder_hold_each_image_once(tmp_path):
    train, written = _looped(tmp_path)
    source = FolderSource(train)
    assert source.classes == ["a", "b", "c"]
    assert [rel for rel, _, _ in source.items()] == [os.path.relpath(p, train) for p in sorted(written)]


def test_a_class_folder_linked_from_a_data_store_is_read(tmp_path):
    """A class folder that is a link to the data elsewhere: followed, as ImageFolder does."""
    store = _tree(tmp_path / "store", classes=("dog",), per_class=3)
    train = tmp_path / "data" / "train"
    _tree(train, classes=("cat",), per_class=2)
    (train / "dog").symlink_to(tmp_path / "store" / "dog")
    assert [rel for rel, _, cls in FolderSource(train).items()] == [
        "cat/0.png",
        "cat/1.png",
        *(f"dog/{i}.png" for i in range(3)),
    ]
    images = open_class_split("imagefolder", str(tmp_path / "data"), "train", None, 0, 224, 0, "--num-train")
    assert np.array_equal(images.labels, [0, 0, 1, 1, 1]) and len(store) == 3
