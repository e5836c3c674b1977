"""Cityscapes (fine annotations, 19 train ids) laid out as published, in a tiny tree written here:
the reader, ``shards`` and ``hbird`` / ``linprobe`` on it, and a tree without ``gtFine`` refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from locatdino import cli as command_line
from locatdino.data import ShardSegmentation
from locatdino.data.datasets.cityscapes import CityscapesSegmentation
from locatdino.data.datasets.segmentation import build_segmentation_dataset

# the 19 evaluated label ids of cityscapesScripts' labels.py, in train-id order (road=7 ... bicycle=33)
EVALUATED = [7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]
IMAGES = {"train": {"aachen": 2, "bremen": 2}, "val": {"lindau": 2}}
SIZE = (32, 16)  # W, H: Cityscapes' 2:1


def expected_train_ids(label_ids: np.ndarray) -> np.ndarray:
    """Naive mapping, pixel by pixel: an evaluated label id's place in EVALUATED, else 255."""
    out = np.full(label_ids.shape, 255, np.uint8)
    for (r, c), value in np.ndenumerate(label_ids):
        if int(value) in EVALUATED:
            out[r, c] = EVALUATED.index(int(value))
    return out


def write_cityscapes(root, train_id_masks=("aachen",)):
    """A published-layout tree: every image has a ``labelIds`` mask (values 0..33), the cities of
    ``train_id_masks`` a ``labelTrainIds`` mask beside it. Returns ``{id: expected train ids}``."""
    expected, k = {}, 0
    for split, cities in IMAGES.items():
        for city, count in cities.items():
            (root / "leftImg8bit" / split / city).mkdir(parents=True)
            (root / "gtFine" / split / city).mkdir(parents=True)
            for frame in range(count):
                name = f"{city}_{frame:06d}_{19 + frame:06d}"
                rng = np.random.default_rng(k)
                label_ids = rng.integers(0, 34, size=SIZE[::-1]).astype(np.uint8)
                label_ids[:, : SIZE[0] // 2] = EVALUATED[k % 19]  # a class large enough to be learnt
                wide = label_ids.astype(np.int64)
                rgb = np.stack([wide * 7, wide * 3, np.full(SIZE[::-1], k * 20, np.uint8)], -1)
                images, gt = root / "leftImg8bit" / split / city, root / "gtFine" / split / city
                Image.fromarray(rgb.astype(np.uint8)).save(images / f"{name}_leftImg8bit.png")
                Image.fromarray(label_ids, "L").save(gt / f"{name}_gtFine_labelIds.png")
                expected[name] = expected_train_ids(label_ids)
                if city in train_id_masks:  # what cityscapesScripts writes: read as is, the labelIds ignored
                    expected[name] = np.roll(expected[name], 1, axis=1)
                    Image.fromarray(expected[name], "L").save(gt / f"{name}_gtFine_labelTrainIds.png")
                k += 1
    return expected


def test_reader_maps_label_ids_to_train_ids_and_prefers_train_id_masks(tmp_path):
    expected = write_cityscapes(tmp_path / "cityscapes")
    ds = build_segmentation_dataset("cityscapes", tmp_path, "train")  # the parent of cityscapes/ works too
    assert isinstance(ds, CityscapesSegmentation) and len(ds) == 4
    assert ds.num_classes == 19 and ds.ignore_index == 255 and ds.class_names[18] == "bicycle"
    ids = ["aachen_000000_000019", "aachen_000001_000020", "bremen_000000_000019", "bremen_000001_000020"]
    assert ds.sample_ids() == ids
    for i, name in enumerate(ds.sample_ids()):
        image, mask = ds[i]
        assert image.size == SIZE and mask.dtype == np.uint8
        np.testing.assert_array_equal(mask, expected[name])
    assert len(CityscapesSegmentation(tmp_path / "cityscapes", "val")) == 2


def _refusal(argv):
    with pytest.raises(SystemExit) as stop:
        command_line.main(argv)
    assert isinstance(stop.value.code, str), stop.value.code
    return stop.value.code


def test_a_tree_without_gtfine_is_refused_in_one_line(tmp_path, capsys):
    write_cityscapes(tmp_path)
    for mask in sorted((tmp_path / "gtFine").rglob("*.png")):
        mask.unlink()
    for folder in sorted((tmp_path / "gtFine").rglob("*"), reverse=True):
        folder.rmdir()
    (tmp_path / "gtFine").rmdir()
    argv = ["--model", "vit_tiny_patch16_224", "--dataset", "cityscapes", "--data-dir", str(tmp_path)]
    err = _refusal(["hbird", *argv, "--out", str(tmp_path / "o")])
    assert err == (
        f"locatdino hbird: no Cityscapes (fine annotations) tree under {tmp_path} "
        "(expected leftImg8bit/ and gtFine/ in it or in one of cityscapes/, Cityscapes/)"
    )
    assert not (tmp_path / "o").exists()
    # shards: the tree is recognised as Cityscapes, so refused, not written as a plain image folder
    assert command_line.main(["shards", str(tmp_path), str(tmp_path / "shards")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"locatdino shards: no Cityscapes (fine annotations) tree under {tmp_path}")
    assert "\n" not in err and not list(tmp_path.glob("shards/*.tar"))


def test_shards_hbird_and_linprobe_run_on_a_published_layout(tmp_path):
    expected = write_cityscapes(tmp_path / "cityscapes")
    for split in ("train", "val"):
        argv = ["shards", str(tmp_path / "cityscapes"), str(tmp_path / "shards" / split), "--split", split]
        assert command_line.main(argv) == 0
    shards = ShardSegmentation(str(tmp_path / "shards" / "train"))
    assert len(shards) == 4 and shards.num_classes == 19 and shards.ignore_index == 255
    got = {tuple(shards[i][1].ravel()) for i in range(len(shards))}
    assert got == {tuple(m.ravel()) for name, m in expected.items() if not name.startswith("lindau")}

    tiny = ["--model", "vit_tiny_patch16_224", "--input-size", "32", "--precision", "fp32", "--workers", "0"]
    for dataset, data_dir in (("cityscapes", tmp_path / "cityscapes"), ("shards", tmp_path / "shards")):
        data = ["--dataset", dataset, "--data-dir", str(data_dir), "--no-progress", *tiny]
        out = tmp_path / f"hbird-{dataset}"
        assert command_line.main(["hbird", *data, "--k", "5", "--out", str(out)]) == 0
        (run,) = json.loads((out / "results.json").read_text())["models"]
        assert run["num_train"] == 4 and run["config"]["dataset"] == dataset
    probe = ["--iters", "6", "--train-batch-size", "2", "--train-augment", "off"]
    data = ["--dataset", "cityscapes", "--data-dir", str(tmp_path), "--no-progress", *tiny]
    assert command_line.main(["linprobe", *data, *probe, "--out", str(tmp_path / "lp")]) == 0
    assert json.loads((tmp_path / "lp" / "results.json").read_text())["models"][0]["config"]["dataset"] == "cityscapes"
