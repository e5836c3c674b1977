"""What ``hbird``, ``linprobe`` and ``compare`` refuse about their data, in one line and the same
way, before any model is loaded: more images than a split has, splits of which no sample can be
used (masks of the wrong size everywhere, labels that are not classes), and ``--index-device
gpu`` with no GPU search to be had."""

import numpy as np
import pytest
import torch
from PIL import Image

from locatdino import cli
from locatdino.data import VOCSegmentation
from locatdino.evaluation.views import BadSample, check_usable, load_pair

COMMANDS = {
    "hbird": ["hbird", "--model", "vit_tiny_patch16_224", "--no-progress"],
    "linprobe": ["linprobe", "--model", "vit_tiny_patch16_224", "--no-progress"],
    "compare": ["compare", "--model", "vit=vit_tiny_patch16_224", "--no-progress"],
}


def _voc(root, n_train=3, n_val=2, val_mask=32, train_label=None):
    """A VOC tree of 32 px images: masks of classes 0..2 (val masks ``val_mask`` px; every train
    label ``train_label`` when given)."""
    voc = root / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True, exist_ok=True)
    for split, n, side, label in (("train", n_train, 32, train_label), ("val", n_val, val_mask, None)):
        ids = [f"{split}{i}" for i in range(n)]
        for i, image_id in enumerate(ids):
            Image.new("RGB", (32, 32), (40 * i, 90, 0)).save(voc / "JPEGImages" / f"{image_id}.jpg")
            mask = np.full((side, side), i % 3 if label is None else label, np.uint8)
            Image.fromarray(mask, "L").save(voc / "SegmentationClass" / f"{image_id}.png")
        (voc / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return voc


def _refusal(argv, capsys):
    """The one line a command ends with (SystemExit's message or the dispatcher's)."""
    try:
        status = cli.main(argv)
    except SystemExit as done:
        status, message = 1, str(done.code)
    else:
        message = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("command", COMMANDS)
def test_more_images_than_a_split_has_is_refused_the_same_way(tmp_path, capsys, monkeypatch, command):
    """16 memory images of a 3-image split ran on 3, said only in a header line."""
    import locatdino.evaluation.model_runs as model_runs

    monkeypatch.setattr(
        model_runs, "load_backbone", lambda *a, **k: pytest.fail("loaded a model before the data check")
    )
    _voc(tmp_path)
    base = [*COMMANDS[command], "--dataset", "voc", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")]
    assert _refusal([*base, "--num-train", "16"], capsys) == (
        f"locatdino {command}: --num-train 16: split 'train' of voc has only 3 images (ask for at most 3, or leave "
        "--num-train out to use them all)"
    )
    assert _refusal([*base, "--num-val", "3"], capsys).endswith(
        "--num-val 3: split 'val' of voc has only 2 images (ask for at most 2, or leave --num-val out to use them all)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_split_with_no_usable_sample_is_refused_naming_the_file(tmp_path, capsys, monkeypatch, command):
    """Wrong-size masks everywhere, or labels out of range, ended with rc 0 and empty scores."""
    import locatdino.evaluation.model_runs as model_runs

    monkeypatch.setattr(
        model_runs, "load_backbone", lambda *a, **k: pytest.fail("loaded a model before the data check")
    )
    base = [*COMMANDS[command], "--dataset", "voc", "--out", str(tmp_path / "out")]
    voc = _voc(tmp_path / "size", val_mask=16)
    assert _refusal([*base, "--data-dir", str(tmp_path / "size")], capsys) == (
        f"locatdino {command}: --val-split val: none of its 2 images can be used (first: "
        f"{voc / 'SegmentationClass' / 'val0.png'} (image val0.jpg): mask (16, 16) does not match image (32, 32))"
    )
    voc = _voc(tmp_path / "labels", train_label=40)
    assert _refusal([*base, "--data-dir", str(tmp_path / "labels")], capsys) == (
        f"locatdino {command}: --train-split train: none of its 3 images can be used (first: "
        f"{voc / 'SegmentationClass' / 'train0.png'} (image train0.jpg): label 40 out of range: classes are 0..20, "
        "ignore index 255)"
    )
    assert not (tmp_path / "out").exists()


def test_a_bad_sample_among_good_ones_is_skipped_and_named(tmp_path):
    voc = _voc(tmp_path)
    mask = np.zeros((32, 32), np.uint8)
    mask[0, :3] = [30, 255, 99]  # 255 is VOC's ignore index, 30 and 99 are no class
    Image.fromarray(mask, "L").save(voc / "SegmentationClass" / "train1.png")
    dataset = VOCSegmentation(tmp_path, "train")
    check_usable(dataset, "--train-split train")  # train0 is fine: no error
    with pytest.warns(UserWarning, match=r"^skipping .*train1.png \(image train1.jpg\): label 30, 99 out of range"):
        assert load_pair(dataset, 1) is None
    image, labels = load_pair(dataset, 2)
    assert image.shape == (3, 32, 32) and labels.dtype == torch.int32 and int(labels.max()) == 2
    with pytest.raises(BadSample, match=r"^--val-split x has no image$"):
        check_usable([], "--val-split x")


@pytest.mark.parametrize("command", ["hbird", "compare"])
def test_index_device_gpu_without_a_gpu_search_is_refused_before_the_memory_pass(capsys, monkeypatch, command):
    import locatdino.evaluation.hbird.evaluate as evaluate
    import locatdino.evaluation.hbird.index as index

    monkeypatch.setattr(index, "faiss_gpu_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(evaluate, "build_memory", lambda *a, **k: pytest.fail("the memory pass started"))
    argv = [*COMMANDS[command], "--num-train", "2", "--num-val", "1", "--scene-size", "32", "--index-device", "gpu"]
    assert _refusal(argv, capsys) == (
        f"locatdino {command}: --index-device gpu: neither FAISS (a faiss-cpu build) nor "
        "torch sees a GPU here: use --index-device auto or cpu"
    )
    with pytest.raises(ValueError, match=r"only exact search runs on a GPU \(--index Flat, not 'IVF64,Flat'"):
        index.check_index_device("gpu", "IVF64,Flat")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch's exact search stands in
    index.check_index_device("gpu", "auto")
    index.check_index_device("gpu", "Flat", "torch")
