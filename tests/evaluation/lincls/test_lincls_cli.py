"""``locatdino lincls`` through the dispatcher: outputs, Δ, skipped images, errors in one line before the work."""

import json

import pytest

from locatdino import cli
from tests.evaluation.lincls.test_lincls import toy_folder
from tests.evaluation.results_schema import valid_results

SMALL = ["--input-size", "32", "--train-batch-size", "6", "--precision", "fp32", "--workers", "0", "--no-progress"]


def test_two_models_write_results_with_intervals_a_delta_and_the_skipped_image(tmp_path, capsys):
    root = toy_folder(tmp_path / "data")
    (root / "train" / "class1" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    out = tmp_path / "out"
    argv = [
        "lincls",
        "--model",
        "vit_tiny_patch16_224",
        "--model",
        "loc=locatvit_tiny_patch16_224",
        "--dataset",
        "imagefolder",
        "--data-dir",
        str(root),
        "--epochs",
        "2",
        "--out",
        str(out),
        *SMALL,
    ]
    assert cli.main(argv) == 0
    assert "| vit_tiny_patch16_224 | full | 4 class tokens |" in capsys.readouterr().out
    report = valid_results(out / "results.json", "lincls")
    first, second = report["models"]
    assert [m["model"]["label"] for m in report["models"]] == ["vit_tiny_patch16_224", "loc"]
    for result in report["models"]:
        assert result["num_train"] == 18 and result["num_val"] == 6 and result["config"]["epochs"] == 2
        assert result["skipped"] == {"train": [str(root / "train" / "class1" / "broken.png")], "val": []}
        top1 = result["scores"][""]["top1"]
        assert top1["interval"][0] <= top1["value"] <= top1["interval"][1]
        assert result["lr"] == pytest.approx(1e-3 * 6 / 256) and result["config"]["dataset"] == "imagefolder"
    assert "differences" not in first and second["differences"][""]["top1"]["resamples"] == 1000
    delta = second["scores"][""]["top1"]["value"] - first["scores"][""]["top1"]["value"]
    assert second["differences"][""]["top1"]["delta"] == pytest.approx(delta, abs=1e-3)
    text = (out / "report.md").read_text()
    assert text.startswith("# Linear classification on frozen features") and "1 train images that do not decode" in text


def test_fast_protocol_reports_every_learning_rate(tmp_path, capsys):
    root = toy_folder(tmp_path / "data")
    out = tmp_path / "out"
    argv = [
        "lincls",
        "--variant",
        "fast",
        "--model",
        "locatvit_tiny_patch16_224",
        "--prr",
        "--lr-grid",
        "0.01",
        "10",
        "--holdout",
        "0.25",
        "--dataset",
        "imagefolder",
        "--data-dir",
        str(root),
        "--out",
        str(out),
        *SMALL,
    ]
    assert cli.main(argv) == 0
    (result,) = json.loads((out / "results.json").read_text())["models"]
    assert [row["base_lr"] for row in result["lr_table"]] == [0.01, 10] and result["config"]["epochs"] == 10
    assert result["linear_input"] == {"last_blocks": 4, "avgpool": False, "prr": True}
    assert "## Learning rates" in (out / "report.md").read_text()


ERRORS = {
    "batch over the training images": (
        ["--train-batch-size", "19"],
        "--train-batch-size 19 is more than the 18 training images",
    ),
    "a label naming the report": (
        ["--model", "Report.md=vit_tiny_patch16_224"],
        "--model label 'Report.md' is the name of a file the command writes into its output folder",
    ),
    "more blocks than the model": (
        ["--last-blocks", "13"],
        "--model vit_tiny_patch16_224: --last-blocks 13: the model has 12 blocks",
    ),
    "holdout of everything": (["--holdout", "1"], "argument --holdout: must lie in (0, 1), got 1"),
    "holdout leaving no image": (
        ["--variant", "fast", "--holdout", "0.99"],
        "locatdino lincls: --holdout 0.99 holds out all 18 training images: nothing is left to train on; pass a "
        "smaller --holdout",
    ),
    "an lr beyond float32": (
        ["--lr", "1e300"],
        "locatdino lincls: --lr 1e+300: the head trains at 1e+300 x 6 / 256 = 2.34e+298, which is no positive "
        "finite float32 (from 1.18e-38 to 3.4e+38): pass a rate in range",
    ),
    "a grid lr that rounds to 0": (
        ["--variant", "fast", "--lr-grid", "0.1", "1e-40"],
        "locatdino lincls: --lr-grid 1e-40: the head trains at 1e-40 x 6 / 256 = 2.34e-42, which is no positive",
    ),
    "validation split is the train split": (
        ["--val-split", "train"],
        "locatdino lincls: --val-split train is the train split (--train-split train): each validation image "
        "would find itself among the train images; score another split",
    ),
    "one train class": (
        ["--num-train", "1"],
        "locatdino lincls: --train-split train: its 1 image holds 1 class ('class",
    ),
    "no lr": (["--lr-grid"], "argument --lr-grid: expected at least one argument"),
    "a fraction of an epoch": (
        ["--epochs", "2.5"],
        "--epochs 2.5: lincls trains whole passes (the reference's cosine steps once per epoch)",
    ),
}


@pytest.mark.parametrize("case", ERRORS, ids=list(ERRORS))
def test_bad_settings_fail_in_one_line_before_any_output(tmp_path, capsys, case):
    root = toy_folder(tmp_path / "data")
    extra, expected = ERRORS[case]
    with pytest.raises(SystemExit) as done:
        cli.main(
            [
                "lincls",
                "--model",
                "vit_tiny_patch16_224",
                "--dataset",
                "imagefolder",
                "--data-dir",
                str(root),
                "--out",
                str(tmp_path / "out"),
                *SMALL,
                *extra,
            ]
        )
    said = capsys.readouterr().err + (done.value.code if isinstance(done.value.code, str) else "")
    assert expected in said and said.strip().count("\n") == 0 and not (tmp_path / "out").exists()


def test_a_validation_class_without_training_images_is_refused(tmp_path):
    root = toy_folder(tmp_path / "data")
    (root / "val" / "class9").mkdir()
    (root / "val" / "class0" / "0.png").rename(root / "val" / "class9" / "0.png")
    with pytest.raises(SystemExit, match="^locatdino lincls: --val-split val: class 'class9' has no train image"):
        cli.main(
            [
                "lincls",
                "--model",
                "vit_tiny_patch16_224",
                "--dataset",
                "imagefolder",
                "--data-dir",
                str(root),
                "--out",
                str(tmp_path / "out"),
                *SMALL,
            ]
        )


@pytest.mark.parametrize("protocol", ["full", "fast"])
def test_a_training_split_where_nothing_decodes_is_one_line(tmp_path, capsys, protocol):
    root = toy_folder(tmp_path / "data")
    for path in (root / "train").rglob("*.png"):
        path.write_bytes(b"not an image")
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "lincls",
                "--variant",
                protocol,
                "--model",
                "vit_tiny_patch16_224",
                "--dataset",
                "imagefolder",
                "--data-dir",
                str(root),
                "--epochs",
                "1",
                "--holdout",
                "0.2",
                "--out",
                str(out),
                *SMALL,
                "--train-batch-size",
                "4",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[lincls] vit_tiny_patch16_224: 18 train") and len(err) == 2
    assert err[1] == (
        f"locatdino lincls: none of the 18 training images decodes (first: {root / 'train' / 'class0' / '0.png'})"
        ": nothing to train on"
    )
    assert not (out / "results.json").exists()


def test_labelled_shards_of_a_folder_give_the_folder_s_numbers(tmp_path):
    from locatdino.data.shards.sources import build_source
    from locatdino.data.shards.writer import write_shards

    root = toy_folder(tmp_path / "data")
    for split in ("train", "val"):
        write_shards(build_source(str(root / split)), tmp_path / "shards" / split, workers=1, progress=False)
    common = [
        "lincls",
        "--variant",
        "fast",
        "--model",
        "vit_tiny_patch16_224",
        "--lr-grid",
        "0.01",
        "1",
        "--holdout",
        "0.25",
        *SMALL,
    ]
    results = []
    for dataset, data_dir in (("imagefolder", root), ("shard-splits", tmp_path / "shards")):
        assert (
            cli.main([*common, "--dataset", dataset, "--data-dir", str(data_dir), "--out", str(tmp_path / dataset)])
            == 0
        )
        (result,) = json.loads((tmp_path / dataset / "results.json").read_text())["models"]
        results.append(result)
    folder, shards = results
    assert shards["num_train"] == folder["num_train"] == 18 and shards["num_val"] == folder["num_val"] == 6
    assert shards["lr_table"] == folder["lr_table"] and shards["scores"] == folder["scores"]


def test_a_second_run_replaces_only_with_overwrite_and_only_what_lincls_wrote(tmp_path):
    """The one overwrite rule (``locatdino.common.output_folder``): refused without ``--overwrite``, the
    earlier run's recorded files replaced with it, a file no run recorded refused with or without."""
    root = toy_folder(tmp_path / "data")
    out = tmp_path / "out"
    argv = [
        "lincls",
        "--variant",
        "fast",
        "--model",
        "vit_tiny_patch16_224",
        "--lr-grid",
        "0.01",
        "--holdout",
        "0.25",
        "--epochs",
        "1",
        "--dataset",
        "imagefolder",
        "--data-dir",
        str(root),
        *SMALL,
    ]
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert list(json.loads((out / ".locatdino-output.json").read_text())["files"]) == ["results.json", "report.md"]
    first = (out / "results.json").read_text()
    with pytest.raises(
        SystemExit,
        match=f"^locatdino lincls: --out {out} holds the output of an earlier run "
        r"\(results.json and 1 more\): pass --overwrite",
    ):
        cli.main([*argv, "--out", str(out)])
    assert (out / "results.json").read_text() == first
    assert cli.main([*argv, "--out", str(out), "--overwrite", "--seed", "3"]) == 0
    assert json.loads((out / "results.json").read_text())["models"][0]["config"]["seed"] == 3
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text("{}")
    for extra in ([], ["--overwrite"]):
        with pytest.raises(SystemExit, match="holds results.json, which locatdino lincls did not write"):
            cli.main([*argv, "--out", str(mine), *extra])
    assert (mine / "results.json").read_text() == "{}"


def test_a_stop_in_the_second_model_keeps_the_first_model_s_written_and_recorded_result(tmp_path, monkeypatch, capsys):
    """The stop line says finished results are kept: the first model's are on disk and in the
    output record before the second starts."""
    from locatdino.common.processes import Terminated
    from locatdino.evaluation.lincls import cli as lincls_cli

    root, out = toy_folder(tmp_path / "data"), tmp_path / "out"
    real, calls = lincls_cli.linear_classification, []

    def stopped_in_the_second(*args, **kwargs):
        calls.append(json.loads((out / "results.json").read_text()) if calls else None)
        if len(calls) == 2:
            raise Terminated()
        return real(*args, **kwargs)

    monkeypatch.setattr(lincls_cli, "linear_classification", stopped_in_the_second)
    argv = ["lincls", "--variant", "fast", "--lr-grid", "0.01", "--holdout", "0.25", "--epochs", "1"]
    argv += ["--model", "first=vit_tiny_patch16_224", "--model", "second=vit_tiny_patch16_224"]
    argv += ["--dataset", "imagefolder", "--data-dir", str(root), "--out", str(out), *SMALL]
    assert cli.main(argv) == 128 + 15
    assert "locatdino lincls: stopped by SIGTERM (results finished before it are kept)" in capsys.readouterr().err
    assert [m["model"]["label"] for m in calls[1]["models"]] == ["first"]  # written before the second started
    report = json.loads((out / "results.json").read_text())
    assert [m["model"]["label"] for m in report["models"]] == ["first"] and report["models"][0]["num_val"] == 6
    assert "| first | fast |" in (out / "report.md").read_text()
    record = (out / ".locatdino-output.json").read_text()
    assert "results.json" in record and "report.md" in record


@pytest.mark.parametrize("variant", ["full", "fast"])
def test_a_learning_rate_that_overflows_the_head_stops_the_model_in_one_line(tmp_path, capsys, variant):
    """lr 1e38 x 6 / 256 trains the head into inf / NaN: no top-1 of a NaN layer is reported."""
    root, out = toy_folder(tmp_path / "data"), tmp_path / "out"
    rate = ["--lr", "1e38"] if variant == "full" else ["--lr-grid", "1e38", "3e38", "--holdout", "0.25"]
    argv = ["lincls", "--variant", variant, *rate, "--epochs", "2", "--model", "vit_tiny_patch16_224"]
    assert cli.main([*argv, "--dataset", "imagefolder", "--data-dir", str(root), "--out", str(out), *SMALL]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("[lincls] vit_tiny_patch16_224: 18 train") and len(err) == 2
    if variant == "full":
        assert err[1].startswith(
            "locatdino lincls: the linear layer's loss or weights are no longer finite after epoch"
        )
        assert err[1].endswith("at lr 2.34e+36 (--lr 1e+38 x 6 / 256): pass a smaller --lr")
    else:
        assert err[1] == (
            "locatdino lincls: the linear layer's weights are no longer finite after 2 epochs at every rate of "
            "--lr-grid (1e+38, 3e+38, each x 6 / 256): pass smaller rates"
        )
    assert not (out / "results.json").exists()


def test_a_diverged_rate_of_the_grid_is_marked_and_never_picked(tmp_path):
    root, out = toy_folder(tmp_path / "data"), tmp_path / "out"
    argv = ["lincls", "--variant", "fast", "--lr-grid", "1e38", "0.01", "--holdout", "0.25", "--epochs", "2"]
    argv += ["--model", "vit_tiny_patch16_224", "--dataset", "imagefolder", "--data-dir", str(root), "--out", str(out)]
    assert cli.main([*argv, *SMALL]) == 0
    (result,) = json.loads((out / "results.json").read_text())["models"]
    assert [(row["holdout_top1"], row["val_top1"]) for row in result["lr_table"]][0] == (None, None)
    assert result["lr"] == pytest.approx(0.01 * 6 / 256) and result["lr_table"][1]["holdout_top1"] is not None
    assert (
        result["scores"][""]["top5"]["value"] is None
        and "| 1e+38 | diverged | diverged |" in (out / "report.md").read_text()
    )
    assert "| vit_tiny_patch16_224 | fast | 4 class tokens | 0.000234 |" in (out / "report.md").read_text()


def test_the_lr_help_names_the_variant_option_lincls_has(capsys):
    with pytest.raises(SystemExit):
        cli.main(["lincls", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "learning rate of the probe's head — --variant full: the base rate" in help_text
        and "--protocol" not in help_text
    )
