"""``locatdino knn`` through the dispatcher: the reference's numbers on a folder and on shards,
outputs, and bad input in one line before any work."""

import json
import shutil

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torchvision import transforms

from locatdino import cli
from tests.evaluation.results_schema import valid_results

CLASSES = ("blue", "green", "red")
KS = (1, 3, 10)


def _write_folder(root, counts, seed):
    """``root/<class>/<i>.png``: noisy images tinted by class, of several sizes (so the resize and
    the crop matter); each image's own colour cast makes random class tokens mislabel some."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(counts):
            h, w = rng.integers(230, 300, 2)
            pixels = rng.normal(128, 60, (h, w, 3)) + rng.normal(0, 25, 3)  # a colour cast per image
            pixels[..., c] += 20
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / name / f"{i}.png")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny ImageNet-layout folder (6 train, 3 val images per class) and a ViT-Ti/16 weights file."""
    root = tmp_path_factory.mktemp("knn")
    _write_folder(root / "data" / "train", 6, seed=0)
    _write_folder(root / "data" / "val", 3, seed=1)
    torch.manual_seed(0)
    weights = root / "vit_tiny.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), weights)
    return root


def reference_features(weights, root):
    """What dino's eval_knn.py computes, independently: its transform (Resize(256, bicubic),
    CenterCrop(224), ImageNet normalisation), the ViT's class token after the final norm,
    L2-normalised; ImageFolder's order and labels."""
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0)
    model.load_state_dict(torch.load(weights))
    view = transforms.Compose(
        [
            transforms.Resize(256, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    paths = sorted((CLASSES.index(p.parent.name), p.name, p) for p in root.glob("*/*.png"))
    with torch.no_grad():
        tokens = model.eval().forward_features(torch.stack([view(Image.open(p).convert("RGB")) for *_, p in paths]))
    return torch.nn.functional.normalize(tokens[:, 0], dim=1).numpy(), np.array([c for c, *_ in paths])


def dino_knn_classifier(train_features, train_labels, test_features, test_labels, k, T, num_classes):
    """facebookresearch/dino's knn_classifier written plainly: top-1 and top-5 counts."""
    similarity = test_features @ train_features.T
    top1 = top5 = 0
    for row, target in zip(similarity, test_labels):
        probs = np.zeros(num_classes)
        for j in np.argsort(-row)[:k]:
            probs[train_labels[j]] += np.exp(row[j] / T)
        predictions = np.argsort(-probs, kind="stable")
        top1 += int(predictions[0] == target)
        top5 += int(target in predictions[: min(5, k)])
    return top1, top5


def test_the_class_tokens_are_the_references(folder):
    """The features the command votes with, image by image (the top-1 / top-5 tests below cannot
    see a small change of view on so few images)."""
    from locatdino.evaluation.class_features import class_token_embeddings
    from locatdino.evaluation.class_splits import open_class_split
    from locatdino.evaluation.features import load_backbone

    model = load_backbone("vit_tiny_patch16_224", str(folder / "vit_tiny.pth"))
    images = open_class_split("imagefolder", str(folder / "data"), "val", None, 0, 224, 0, "--num-val")
    with class_token_embeddings(model, images, 224, batch_size=4, workers=0, show_progress=False) as found:
        features, labels = reference_features(folder / "vit_tiny.pth", folder / "data" / "val")
        np.testing.assert_allclose(found.features, features, atol=2e-5)
        assert found.labels.tolist() == labels.tolist() and found.kept.tolist() == list(range(9))


def _run(argv, out):
    assert (
        cli.main(["knn", *argv, "--neighbours", *map(str, KS), "--out", str(out), "--no-progress", "--workers", "0"])
        == 0
    )
    return valid_results(out / "results.json", "knn")


@pytest.fixture(scope="module")
def expected(folder):
    train, train_labels = reference_features(folder / "vit_tiny.pth", folder / "data" / "train")
    val, val_labels = reference_features(folder / "vit_tiny.pth", folder / "data" / "val")
    counts = {k: dino_knn_classifier(train, train_labels, val, val_labels, k, 0.07, len(CLASSES)) for k in KS}
    assert any(0 < top1 < 9 for top1, _ in counts.values())  # the classifier neither always right nor always wrong
    return counts


def _assert_reference_counts(result, expected):
    """Top-1 within one image of the reference's; top-5 not applicable: 3 classes are all in it."""
    for k in KS:
        scores = result["scores"][f"k={k}"]
        top1 = scores["top1"]["value"]
        assert abs(top1 * 9 / 100 - expected[k][0]) <= 1 + 1e-6, (k, scores, expected[k])  # within one image
        assert scores["top5"] == {"value": None, "interval": None}


def test_imagefolder_gives_the_reference_top1_top5(folder, expected, tmp_path, capsys):
    out = tmp_path / "out"
    result = _run(
        [
            "--model",
            f"vit_tiny_patch16_224:{folder / 'vit_tiny.pth'}",
            "--dataset",
            "imagefolder",
            "--data-dir",
            str(folder / "data"),
        ],
        out,
    )
    (model,) = result["models"]
    _assert_reference_counts(model, expected)
    assert model["data"]["train"] == {"images": 18, "classes": 3, "skipped": []}
    assert model["config"]["precision"] == "fp32" and model["config"]["temperature"] == 0.07
    low, high = model["scores"]["k=10"]["top1"]["interval"]
    assert low <= model["scores"]["k=10"]["top1"]["value"] <= high
    assert "| vit_tiny_patch16_224-vit_tiny | k=10 |" in (out / "report.md").read_text()
    assert (out / "report.md").read_text().count("| n/a |") == len(KS)  # top-5 of 3 classes
    assert "| vit_tiny_patch16_224-vit_tiny | k=10 |" in capsys.readouterr().out


def test_labelled_shards_give_the_same_numbers_and_a_second_model_a_paired_delta(folder, expected, tmp_path):
    from locatdino.data.shards.sources import build_source
    from locatdino.data.shards.writer import write_shards

    for split in ("train", "val"):
        write_shards(build_source(str(folder / "data" / split)), tmp_path / "shards" / split, workers=1, progress=False)
    weights = str(folder / "vit_tiny.pth")
    result = _run(
        [
            "--model",
            f"ref=vit_tiny_patch16_224:{weights}",
            "--model",
            f"again=vit_tiny_patch16_224:{weights}",
            "--dataset",
            "shard-splits",
            "--data-dir",
            str(tmp_path / "shards"),
        ],
        tmp_path / "out",
    )
    first, second = result["models"]
    _assert_reference_counts(first, expected)
    assert "differences" not in first and second["scores"] == first["scores"]
    assert second["differences"]["k=10"]["top1"]["delta"] == 0 and second["differences"]["k=10"]["top1"]["low"] == 0
    assert "top5" not in second["differences"]["k=10"]  # not applicable to 3 classes


def test_an_image_that_does_not_decode_is_skipped_counted_and_named(folder, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(folder / "data", data)
    (data / "val" / "red" / "broken.png").write_bytes(b"not a png")
    result = _run(
        [
            "--model",
            "vit_tiny_patch16_224",
            "--dataset",
            "imagefolder",
            "--data-dir",
            str(data),
            "--input-size",
            "32",
            "--precision",
            "fp32",
        ],
        tmp_path / "out",
    )
    val = result["models"][0]["data"]["val"]
    assert val["images"] == 10 and val["scored"] == 9 and val["skipped"] == [str(data / "val" / "red" / "broken.png")]
    assert "skipped 1 validation image that do not decode" in capsys.readouterr().err


def _bad_folder(tmp_path, case):
    data = tmp_path / "data"
    _write_folder(data / "train", 2, seed=0)
    _write_folder(data / "val", 1, seed=1)
    if case == "val class missing from train":
        (data / "val" / "yellow").mkdir()
        Image.new("RGB", (8, 8)).save(data / "val" / "yellow" / "0.png")
    elif case == "empty class folder":
        (data / "train" / "yellow").mkdir()
    elif case == "one train class":
        for name in CLASSES[1:]:
            for split in ("train", "val"):
                shutil.rmtree(data / split / name)
    return data


BAD_INPUT = {
    "val class missing from train": (
        [],
        "^locatdino knn: --val-split val: class 'yellow' has no train image: a k-NN can never predict it$",
    ),
    "empty class folder": ([], r"^locatdino knn: class folder \S+/train/yellow holds no image \(.jpg"),
    "one train class": (
        [],
        r"^locatdino knn: --train-split train: its 2 images hold 1 class \('blue'\): classification needs at "
        r"least 2 \(with one, every image is right\)$",
    ),
    "validation split is the train split": (
        ["--val-split", "./train/"],
        r"^locatdino knn: --val-split ./train/ is the train split \(--train-split train\): each validation image "
        "would find itself among the train images; score another split$",
    ),
    "k larger than the train set": (
        ["--neighbours", "20", "7"],
        r"^locatdino knn: --neighbours 20: the train split "
        r"'train' holds 6 images \(use k <= 6\)$",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, case):
    extra, message = BAD_INPUT[case]
    data, out = _bad_folder(tmp_path, case), tmp_path / "out"
    with pytest.raises(SystemExit, match=message):
        cli.main(
            [
                "knn",
                "--model",
                "vit_tiny_patch16_224",
                "--dataset",
                "imagefolder",
                "--data-dir",
                str(data),
                "--out",
                str(out),
                *extra,
            ]
        )
    assert not out.exists() and "[knn]" not in capsys.readouterr().err


@pytest.mark.parametrize("label", ["results.json", "Report.md", ".locatdino.lock"])
def test_a_label_naming_a_file_of_the_output_folder_is_refused(tmp_path, capsys, label):
    """A label names its run's table row and, as for every evaluation, may not be a file knn writes."""
    with pytest.raises(SystemExit) as done:
        cli.main(["knn", "--model", f"{label}=vit_tiny_patch16_224", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert f"locatdino knn: --model label {label!r} " in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be a positive number, got 0"),
        ("-0.1", "must be a positive number, got -0.1"),
        ("nan", "must be a positive number, got nan"),
        ("1e-320", "temperature must be > 0 with cos / T finite in float64 (T >= 1.11e-308), got 1e-320"),
    ],
)
def test_a_temperature_that_is_not_positive_is_refused_at_parse_time(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as done:
        cli.main(["knn", "--model", "vit_tiny_patch16_224", "--temperature", value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1
    assert f"argument --temperature: {message}" in err


@pytest.mark.parametrize(("split", "use"), [("train", "vote with"), ("val", "score")])
def test_a_split_where_nothing_decodes_is_one_line_before_the_search(tmp_path, capsys, split, use):
    """Checked once the images are decoded, as the train split's, not by the interval's own error."""
    data = _bad_folder(tmp_path, "")
    for path in (data / split).rglob("*.png"):
        path.write_bytes(b"not an image")
    argv = ["--model", "vit_tiny_patch16_224", "--dataset", "imagefolder", "--data-dir", str(data)]
    argv += ["--input-size", "32", "--neighbours", "1", "--out", str(tmp_path / "out"), "--no-progress"]
    with pytest.raises(SystemExit) as done:
        cli.main(["knn", *argv, "--workers", "0"])
    first = sorted(data.glob(f"{split}/*/*.png"))[0]
    name = "train" if split == "train" else "validation"
    count = 6 if split == "train" else 3
    assert done.value.code == (
        f"locatdino knn: none of the {count} {name} images decodes (first: {first}): nothing to {use}"
    )
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_second_run_keeps_the_first_ones_results_unless_overwrite(tmp_path, capsys):
    """The one overwrite rule of every command (``locatdino.common.output_folder``): the files a run
    wrote are recorded, a second run is refused in one line, ``--overwrite`` replaces them, and a
    file no run recorded is refused with or without it."""
    out = tmp_path / "out"
    common = [
        "knn",
        "--model",
        "vit_tiny_patch16_224",
        "--num-train",
        "12",
        "--num-val",
        "4",
        "--scene-size",
        "32",
        "--input-size",
        "32",
        "--neighbours",
        "5",
        "--no-progress",
        "--workers",
        "0",
    ]
    argv = [*common, "--out", str(out)]
    assert cli.main(argv) == 0
    record = json.loads((out / ".locatdino-output.json").read_text())
    assert record["command"] == "knn" and list(record["files"]) == ["results.json", "report.md"]
    first = (out / "results.json").read_bytes()
    with pytest.raises(
        SystemExit,
        match=f"^locatdino knn: --out {out} holds the output of an earlier run "
        r"\(results.json and 1 more\): pass --overwrite to replace it, or choose another --out$",
    ):
        cli.main(argv)
    assert (out / "results.json").read_bytes() == first
    assert cli.main([*argv, "--overwrite", "--seed", "1"]) == 0
    assert json.loads((out / "results.json").read_text())["models"][0]["config"]["seed"] == 1
    capsys.readouterr()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    for extra in ([], ["--overwrite"]):
        with pytest.raises(
            SystemExit, match=f"^locatdino knn: --out {mine} holds report.md, which locatdino knn did not write"
        ):
            cli.main([*common, "--out", str(mine), *extra])
    assert (mine / "report.md").read_text() == "my notes" and "[knn]" not in capsys.readouterr().err
