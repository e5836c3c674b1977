"""The memory images named by id (``--train-list``, ``--fraction``): exactly the listed images, the
published lists shipped and readable without a dataset, and every unusable list refused in one
line before any model is loaded."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from locatdino import cli as command_line
from locatdino.data import ScenesSegmentation
from locatdino.data.datasets.published_lists import FRACTION_SEEDS, FRACTIONS, published_ids, published_list_path
from locatdino.evaluation.hbird import cli as hbird_cli
from locatdino.evaluation.options import open_splits

# ids per published list, as open-hummingbird-eval ships them (the same for every seed)
PUBLISHED_COUNTS = {
    ("voc", "1/8"): 1320,
    ("voc", "1/64"): 160,
    ("voc", "1/128"): 80,
    ("ade20k", "1/8"): 2550,
    ("ade20k", "1/64"): 300,
    ("ade20k", "1/128"): 150,
}
SCENES = ["--scene-size", "32", "--num-val", "2"]


def _args(*argv: str):
    return hbird_cli._parser().parse_args(["--model", "vit_tiny_patch16_224", *argv])


def _refusal(argv: list[str]) -> str:
    """The one line a command stops with (its ``SystemExit`` message)."""
    with pytest.raises(SystemExit) as stop:
        command_line.main(argv)
    assert isinstance(stop.value.code, str), stop.value.code
    return stop.value.code


def _voc_trainaug(root, ids, val_ids=()):
    """A VOC tree whose trainaug split holds ``ids`` (2×2 images, masks of one class each)."""
    voc = root / "VOC2012"
    for d in ("JPEGImages", "SegmentationClassAug", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True)
    for k, image_id in enumerate([*ids, *val_ids]):
        Image.new("RGB", (2, 2), (k % 256, 0, 0)).save(voc / "JPEGImages" / f"{image_id}.jpg")
        Image.fromarray(np.full((2, 2), k % 21, np.uint8), "L").save(voc / "SegmentationClassAug" / f"{image_id}.png")
    (voc / "ImageSets/Segmentation/trainaug.txt").write_text("\n".join(sorted(ids)) + "\n")
    (voc / "ImageSets/Segmentation/val.txt").write_text("\n".join(val_ids) + "\n")
    return root


def test_a_written_list_selects_exactly_those_scenes_in_id_order(tmp_path):
    listed = ["train_00250", "train_00003", "train_00017", "train_00003"]  # a repeat is one image
    (tmp_path / "ids.txt").write_text("\n".join(listed) + "\n\n")
    train, _ = open_splits(_args("--train-list", str(tmp_path / "ids.txt"), *SCENES))
    assert len(train) == 3
    pool = ScenesSegmentation(300, size=32, split="train")  # the scenes a list names: the default 300
    for got, index in zip(range(len(train)), (3, 17, 250)):
        image, mask = train[got]
        np.testing.assert_array_equal(np.asarray(image), np.asarray(pool[index][0]))
        np.testing.assert_array_equal(mask, pool[index][1])


def test_every_published_list_is_shipped_and_read_without_the_dataset():
    for (dataset, fraction), count in PUBLISHED_COUNTS.items():
        for seed in FRACTION_SEEDS:
            ids = published_ids(dataset, fraction, seed)
            assert len(ids) == len(set(ids)) == count, (dataset, fraction, seed)
            prefix = "ADE_train_" if dataset == "ade20k" else "20"
            assert all(i.startswith(prefix) for i in ids)
    assert published_ids("voc", "1/128", 42)[:2] == ["2008_007456", "2011_001498"]  # the source's first lines
    assert (published_list_path("voc", "1/8", 42).parents[2] / "LICENSE").read_text().startswith("MIT License")
    assert set(FRACTIONS) == {f for _, f in PUBLISHED_COUNTS}


def test_fraction_selects_the_published_voc_images(tmp_path):
    ids = published_ids("voc", "1/128", 400)
    extra = ["2007_000032", "2007_000039"]  # trainaug images the list leaves out
    root = _voc_trainaug(tmp_path, [*ids, *extra], val_ids=["2007_000033"])
    argv = ["--dataset", "voc", "--data-dir", str(root), "--train-split", "trainaug", "--fraction", "1/128"]
    train, val = open_splits(_args(*argv, "--fraction-seed", "400"))
    assert [train.dataset.sample_ids()[i] for i in train.indices] == sorted(ids) and len(val) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train-list", "{list}", "--num-train", "4"], "give --num-train or --train-list, not both"),
        (["--fraction-seed", "42"], "--fraction-seed 42 picks a list of --fraction: give --fraction too"),
        (["--fraction", "1/8"], "--fraction 1/8: open-hummingbird-eval publishes subsets of voc and ade20k only"),
        (["--train-list", "{list}", "--fraction", "1/8"], "give --train-list or --fraction, not both"),
        (["--train-list", "{missing}"], "--train-list {missing}: No such file or directory"),
    ],
)
def test_unusable_list_options_are_refused_in_one_line_before_any_model(tmp_path, argv, message):
    good = tmp_path / "ids.txt"
    good.write_text("train_00001\n")
    fill = {"list": str(good), "missing": str(tmp_path / "nope.txt")}
    argv = [a.format(**fill) for a in argv]
    out = tmp_path / "out"
    err = _refusal(["hbird", "--model", "vit_tiny_patch16_224", "--out", str(out), *argv, *SCENES])
    assert err.startswith(f"locatdino hbird: {message.format(**fill)}")
    assert "\n" not in err and not out.exists()


def test_ids_of_the_other_split_are_refused_naming_the_first_and_how_many(tmp_path):
    val_ids = ["2008_000002", "2008_000003", "2008_000004", "2008_000005"]
    root = _voc_trainaug(tmp_path, ["2007_000032", "2007_000039"], val_ids=val_ids)
    listed = tmp_path / "ids.txt"
    listed.write_text("\n".join(["2007_000032", *val_ids, "2099_999999"]) + "\n")
    argv = ["--dataset", "voc", "--data-dir", str(root), "--train-split", "trainaug", "--train-list", str(listed)]
    err = _refusal(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "o"), *argv])
    assert err == (
        f"locatdino linprobe: --train-list {listed}: 5 of its 6 ids are not images of split 'trainaug' (2 images): "
        "2008_000002, 2008_000003, 2008_000004, ...; 4 of them are images of the query split"
    )


def test_a_fraction_of_the_wrong_split_or_an_unpublished_one_is_refused(tmp_path, capsys):
    root = _voc_trainaug(tmp_path, ["2007_000032"], val_ids=["2007_000033"])
    argv = ["--model", "vit_tiny_patch16_224", "--dataset", "voc", "--data-dir", str(root)]
    argv += ["--out", str(tmp_path / "o")]
    assert _refusal(["compare", *argv, "--fraction", "1/64"]) == (
        "locatdino compare: --fraction 1/64: the published voc lists are subsets of split 'trainaug', "
        "not --train-split train (add --train-split trainaug)"
    )
    with pytest.raises(SystemExit) as stop:
        command_line.main(["hbird", *argv, "--fraction", "1/16"])
    assert stop.value.code == 2 and "invalid choice: '1/16'" in capsys.readouterr().err


def test_hbird_on_a_listed_memory_records_the_list(tmp_path):
    import json

    listed = tmp_path / "ids.txt"
    listed.write_text("train_00005\ntrain_00001\ntrain_00009\n")
    out = tmp_path / "out"
    argv = ["--model", "vit_tiny_patch16_224", "--train-list", str(listed), "--input-size", "32", "--k", "5"]
    assert hbird_cli.main([*argv, *SCENES, "--workers", "0", "--no-progress", "--out", str(out)]) == 0
    (run,) = json.loads((out / "results.json").read_text())["models"]
    assert run["config"]["train_list"] == {"file": str(listed)}
    assert run["num_train"] == 3
