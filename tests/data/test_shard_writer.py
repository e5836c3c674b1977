import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from locatdino.data import cli
from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation, scene_class, scene_classes
from locatdino.data.shard_sources import FolderSource, ScenesSource, build_source
from locatdino.data.shard_stream import expand_urls
from locatdino.data.shard_writer import write_shards


def _members(path):
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def test_scenes_shards_index_and_determinism_across_worker_counts(tmp_path):
    a = write_shards(ScenesSource(7, seed=2, size=32), tmp_path / "a", maxcount=3, workers=0, progress=False)
    b = write_shards(ScenesSource(7, seed=2, size=32), tmp_path / "b", maxcount=3, workers=2, progress=False)
    assert [s["num_samples"] for s in a["shards"]] == [3, 3, 1]
    assert [(s["name"], s["num_samples"]) for s in b["shards"]] == [(s["name"], s["num_samples"]) for s in a["shards"]]
    assert a["num_samples"] == 7 and a["urls"] == "shard-{000000..000002}.tar"
    assert a["segmentation"]["num_classes"] == 10 and a["segmentation"]["ignore_index"] is None
    on_disk = json.loads((tmp_path / "a" / "index.json").read_text())
    assert on_disk["total_bytes"] == sum((tmp_path / "a" / s["name"]).stat().st_size for s in a["shards"])
    for s in a["shards"]:
        assert _members(tmp_path / "a" / s["name"]) == _members(tmp_path / "b" / s["name"])
    members = _members(tmp_path / "a" / "shard-000000.tar")
    assert [n for n, _ in members[:4]] == [f"scene_train_2_00000000.{k}" for k in ("classes.json", "cls", "jpg", "seg.png")]
    assert a["classes"] == list(SCENE_CLASSES) and a["multilabel_share"] == 0.05
    _, mask = ScenesSegmentation(1, size=32, seed=2)[0]
    assert members[1][1].decode() == str(scene_class(mask)) and json.loads(members[0][1]) == scene_classes(mask, 0.05)
    assert not list((tmp_path / "a").glob(".tmp-*"))  # temporary folder removed


def test_rerun_is_refused_unless_overwrite_and_never_mixes_sets(tmp_path):
    write_shards(ScenesSource(5, size=16), tmp_path, maxcount=2, workers=0, progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_shards(ScenesSource(3, size=16), tmp_path, maxcount=2, workers=0, progress=False)
    index = write_shards(ScenesSource(3, size=16), tmp_path, maxcount=2, workers=0, progress=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["shard-000000.tar", "shard-000001.tar"]
    assert index["num_samples"] == 3
    (tmp_path / "other.tar").write_bytes(b"")
    with pytest.raises(FileExistsError, match="other.tar"):
        write_shards(ScenesSource(3, size=16), tmp_path, maxcount=2, workers=0, progress=False, overwrite=True)


def test_maxsize_starts_new_shards(tmp_path):
    index = write_shards(ScenesSource(6, size=32), tmp_path, maxcount=100, maxsize=2000, workers=0, progress=False)
    assert index["num_shards"] > 1 and index["num_samples"] == 6


def _image_tree(root, classes):
    for k, cls in enumerate(classes):
        folder = root / cls if cls else root
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(k + 1):
            Image.new("RGB", (8, 8), (k * 40, i, 0)).save(folder / f"img.{i}.{'png' if i % 2 else 'jpeg'}")


def test_class_folders_give_cls_and_class_counts(tmp_path):
    _image_tree(tmp_path / "src", ["cat", "dog", "emu"])
    index = write_shards(FolderSource(tmp_path / "src"), tmp_path / "out", maxcount=4, workers=0, progress=False)
    assert index["classes"] == ["cat", "dog", "emu"] and index["class_counts"] == {"0": 1, "1": 2, "2": 3}
    members = dict(m for s in index["shards"] for m in _members(tmp_path / "out" / s["name"]))
    assert members["dog/img_1.cls"] == b"1" and "emu/img_0.jpg" in members and "emu/img_1.png" in members


def test_flat_folder_has_no_classes(tmp_path):
    _image_tree(tmp_path, [""])
    source = build_source(tmp_path)
    assert isinstance(source, FolderSource) and source.classes is None
    assert "cls" not in source.sample(source.items()[0])


def test_cli_writes_scenes_and_reports_errors(tmp_path, capsys):
    out = str(tmp_path / "s")
    assert cli.main(["--synthetic", "5", "--seed", "1", "--size", "32", out, "--maxcount", "2", "--quiet",
                     "--workers", "0"]) == 0
    assert "wrote 5 samples in 3 shards" in capsys.readouterr().out
    assert len(expand_urls(out)) == 3
    assert cli.main(["--synthetic", "5", out, "--quiet"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "missing"), out + "2", "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli._bytes("500M") == 5e8 and cli._bytes("2GB") == 2e9


def test_written_images_decode_back_to_the_scene(tmp_path):
    from locatdino.data.scenes import render_scene, scene_rng
    from locatdino.data.segmentation import build_segmentation_dataset

    write_shards(ScenesSource(2, seed=5, size=48, split="val"), tmp_path, workers=0, progress=False)
    ds = build_segmentation_dataset("shards", tmp_path, "val")
    image, mask = render_scene(scene_rng(5, 1, "val"), 48)
    np.testing.assert_array_equal(ds[1][1], mask)
    assert np.abs(np.asarray(ds[1][0]).astype(int) - image).mean() < 4  # JPEG q90
