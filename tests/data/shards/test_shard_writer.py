import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from locatdino.data.scenes import SCENE_CLASSES, ScenesSegmentation, scene_class, scene_classes
from locatdino.data.shards import cli
from locatdino.data.shards.sources import FolderSource, ScenesSource, build_source
from locatdino.data.shards.stream import expand_urls
from locatdino.data.shards.writer import write_shards


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
    assert [n for n, _ in members[:4]] == [
        f"scene_train_2_00000000.{k}" for k in ("classes.json", "cls", "jpg", "seg.png")
    ]
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


class _NoWork(ScenesSource):
    """A source whose items must not be listed: the refusal comes before any work."""

    def items(self):
        raise AssertionError("work started before the folder was checked")


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_overwrite_removes_only_the_shards_the_index_lists(tmp_path):
    write_shards(ScenesSource(5, size=16), tmp_path, maxcount=2, workers=0, progress=False)  # 3 shards
    (tmp_path / "shard-000007.tar").write_bytes(b"the user's, named like a shard")
    before = _files(tmp_path)
    with pytest.raises(FileExistsError) as refused:
        write_shards(_NoWork(1, size=16), tmp_path, maxcount=2, workers=0, progress=False, overwrite=True)
    assert str(refused.value) == (
        f"{tmp_path} holds shard-000007.tar, which its index.json does not list: --overwrite replaces only the "
        "listed shards, and a *.tar glob would mix two sets; move it or choose another directory"
    )
    assert _files(tmp_path) == before
    (tmp_path / "shard-000007.tar").unlink()
    index = json.loads((tmp_path / "index.json").read_text())
    index["shards"] = index["shards"][:2]  # an index of two of the three: the third is not its to remove
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(FileExistsError, match="holds shard-000002.tar, which its index.json does not list"):
        write_shards(_NoWork(1, size=16), tmp_path, maxcount=2, workers=0, progress=False, overwrite=True)
    (tmp_path / "shard-000002.tar").rename(tmp_path / "kept.bin")
    write_shards(ScenesSource(1, size=16), tmp_path, maxcount=2, workers=0, progress=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "kept.bin", "shard-000000.tar"]


def test_overwrite_refuses_shards_without_an_index_and_a_damaged_index(tmp_path):
    (tmp_path / "shard-000000.tar").write_bytes(b"no index says whose")
    (tmp_path / "shard-000001.tar").write_bytes(b"no index says whose")
    with pytest.raises(FileExistsError) as refused:
        write_shards(_NoWork(1, size=16), tmp_path, workers=0, progress=False, overwrite=True)
    assert str(refused.value) == (
        f"{tmp_path} holds 2 .tar file(s) (e.g. shard-000000.tar) but no index.json: no shard set of locatdino "
        "shards to replace; move them or choose another directory"
    )
    for index, problem in [
        ({"num_shards": 2}, "does not list its shards"),
        ({"shards": [{"name": "../shard-000000.tar"}]}, "lists '../shard-000000.tar', not a shard file name"),
    ]:
        (tmp_path / "index.json").write_text(json.dumps(index))
        with pytest.raises(FileExistsError) as refused:
            write_shards(_NoWork(1, size=16), tmp_path, workers=0, progress=False, overwrite=True)
        assert str(refused.value) == (
            f"{tmp_path / 'index.json'} {problem} (written by locatdino shards?): refusing to remove anything; "
            "choose another directory"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "shard-000000.tar", "shard-000001.tar"]


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
    assert (
        cli.main(
            ["--synthetic", "5", "--seed", "1", "--size", "32", out, "--maxcount", "2", "--quiet", "--workers", "0"]
        )
        == 0
    )
    assert "wrote 5 samples in 3 shards" in capsys.readouterr().out
    assert len(expand_urls(out)) == 3
    assert cli.main(["--synthetic", "5", out, "--quiet"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "missing"), out + "2", "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli._bytes("500M") == 5e8 and cli._bytes("2GB") == 2e9


def test_written_images_decode_back_to_the_scene(tmp_path):
    from locatdino.data.datasets.segmentation import build_segmentation_dataset
    from locatdino.data.scenes import render_scene, scene_rng

    write_shards(ScenesSource(2, seed=5, size=48, split="val"), tmp_path, workers=0, progress=False)
    ds = build_segmentation_dataset("shards", tmp_path, "val")
    image, mask = render_scene(scene_rng(5, 1, "val"), 48)
    np.testing.assert_array_equal(ds[1][1], mask)
    assert np.abs(np.asarray(ds[1][0]).astype(int) - image).mean() < 4  # JPEG q90


# --- what users trip on: a prefix outside OUT_DIR, files that are not images, colliding keys,
# --- sizes that make empty shards, contradictory sources, a disk that fills


def _read_back(folder):
    """(key, sorted member suffixes) of every sample a WebDataset reader gets from ``folder``."""
    import webdataset as wds

    urls = [{"url": u} for u in expand_urls(str(folder))]
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in wds.tarfile_to_samples()(urls)]


@pytest.mark.parametrize("prefix", ["../other", "/tmp/abs", "a/b", "", "x..y"])
def test_a_prefix_is_a_file_name_stem_refused_before_any_work(tmp_path, capsys, prefix):
    _image_tree(tmp_path / "src", [""])
    with pytest.raises(SystemExit) as done:
        cli.main([str(tmp_path / "src"), str(tmp_path / "out"), "--prefix", prefix, "--quiet"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and f"--prefix: {prefix!r} is not a file-name stem" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing written, not even OUT_DIR
    with pytest.raises(ValueError, match="--prefix"):
        write_shards(ScenesSource(1, size=8), tmp_path / "out", prefix=prefix, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_files_that_do_not_decode_are_skipped_counted_and_named(tmp_path, capsys):
    src = tmp_path / "src"
    _image_tree(src, [""])  # img.0.jpeg: one good image
    Image.new("RGB", (40, 30), (1, 2, 3)).save(src / "good.jpg", quality=90)
    (src / "text.jpg").write_text("not an image")
    (src / "empty.png").write_bytes(b"")
    (src / "cut.jpg").write_bytes((src / "good.jpg").read_bytes()[:300])  # truncated JPEG
    assert cli.main([str(src), str(tmp_path / "out"), "--quiet", "--workers", "2", "--maxcount", "2"]) == 0
    captured = capsys.readouterr()
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["num_samples"] == 2 == len(_read_back(tmp_path / "out"))
    assert index["skipped_files"]["count"] == 3
    assert [n.split(":")[0] for n in index["skipped_files"]["first"]] == ["cut.jpg", "empty.png", "text.jpg"]
    assert "empty.png: empty file (0 bytes)" in index["skipped_files"]["first"][1]
    assert sum(s["num_samples"] for s in index["shards"]) == 2 and all(s["num_samples"] for s in index["shards"])
    assert captured.err.count("\n") == 1 and "skipped 3 file(s) that do not decode" in captured.err
    assert "wrote 2 samples" in captured.out


def test_a_folder_without_a_real_image_is_refused_and_leaves_nothing(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_text("hello")
    (src / "b.png").write_bytes(b"")
    assert cli.main([str(src), str(tmp_path / "out"), "--quiet", "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "locatdino shards: nothing to write: none of the 2 file(s) decodes, e.g. a.jpg: "
        "UnidentifiedImageError: cannot identify image file\n"
    )
    assert not (tmp_path / "out").exists()


def test_colliding_sample_keys_lose_no_image(tmp_path, capsys):
    """WebDataset groups the tar members of one key into one sample: a.jpg + a.png were read as one."""
    src = tmp_path / "src"
    src.mkdir()
    names = ["a.jpg", "a.png", "a.b.jpg", "a_b.jpg", "a_png.png", "c.jpeg", "c.jpg"]
    for i, name in enumerate(names):
        Image.new("RGB", (8, 8), (30 * i, 0, 0)).save(src / name, format="PNG" if name.endswith("png") else "JPEG")
    assert cli.main([str(src), str(tmp_path / "out"), "--quiet", "--workers", "0"]) == 0
    assert "7 file(s)" not in capsys.readouterr().err
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    samples = _read_back(tmp_path / "out")
    assert index["num_samples"] == len(samples) == 7 and len({k for k, _ in samples}) == 7
    assert index["renamed_keys"] == {"count": 3, "first": {"a.png": "a_png_2", "a_b.jpg": "a_b_jpg", "c.jpg": "c_jpg"}}
    assert dict(samples)["a_png_2"] == ["png"] and dict(samples)["a_png"] == ["png"]
    members = dict(_members(tmp_path / "out" / "shard-000000.tar"))
    assert members["a_png_2.png"] == (src / "a.png").read_bytes()  # each file under its own key
    assert members["a.jpg"] == (src / "a.jpg").read_bytes()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--maxsize", "0"], "argument --maxsize: must be more than 0 bytes, got '0'"),
        (["--maxsize", "-5"], "argument --maxsize: must be more than 0 bytes, got '-5'"),
        (["--synthetic", "3"], "--synthetic 3 writes built-in scenes, but the source {src} was given too: drop one"),
    ],
)
def test_sizes_and_sources_that_contradict_are_refused(tmp_path, capsys, argv, message):
    _image_tree(tmp_path / "src", [""])
    try:
        code = cli.main([str(tmp_path / "src"), str(tmp_path / "out"), "--quiet", *argv])
    except SystemExit as done:
        code = done.code
    err = capsys.readouterr().err
    assert code in (1, 2) and err.count("\n") == 1 and message.format(src=tmp_path / "src") in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="maxsize more than 0 bytes"):
        write_shards(ScenesSource(2, size=8), tmp_path / "out", maxsize=0, workers=0, progress=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_disk_that_fills_leaves_no_shard_and_the_earlier_set(tmp_path, capsys, monkeypatch, workers):
    import errno

    import webdataset as wds

    out = tmp_path / "out"
    earlier = write_shards(ScenesSource(3, size=16), out, maxcount=2, workers=0, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write = wds.TarWriter.write

    def fill_up(self, obj):  # the third sample of a shard hits a full disk (worker processes fork this)
        if obj["__key__"].endswith("2"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, obj)

    monkeypatch.setattr(wds.TarWriter, "write", fill_up)
    assert (
        cli.main(
            [
                "--synthetic",
                "6",
                "--size",
                "16",
                str(out),
                "--maxcount",
                "3",
                "--workers",
                str(workers),
                "--overwrite",
                "--quiet",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        err == f"locatdino shards: {out}: No space left on device while writing shards (no shard written; "
        "the folder is as it was)\n"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no half shard, no temporary folder
    assert [s["name"] for s in earlier["shards"]] == ["shard-000000.tar", "shard-000001.tar"]
