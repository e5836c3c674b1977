"""``--layer`` of hbird, linprobe and compare: checked against each model's depth when the models
are built, before any feature is computed; negative indices count from the end, as the default -1."""

import pytest

from locatdino import cli
from locatdino.evaluation.compare import cli as compare_cli
from locatdino.evaluation.features import check_layer
from locatdino.evaluation.hbird import cli as hbird_cli
from locatdino.evaluation.linprobe import cli as probe_cli

DATA = [
    "--num-train",
    "4",
    "--num-val",
    "2",
    "--scene-size",
    "32",
    "--input-size",
    "32",
    "--workers",
    "0",
    "--no-progress",
]


def test_check_layer_accepts_exactly_the_blocks_of_the_model():
    for layer in (*range(12), *range(-12, 0)):
        check_layer(12, layer, "vit_small_patch16_224")
    for layer in (12, 20, -13):
        with pytest.raises(Exception, match=f"--layer {layer}: vit_small_patch16_224 has 12 blocks"):
            check_layer(12, layer, "vit_small_patch16_224")


@pytest.fixture
def nothing_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an evaluation started before --layer was checked")

    monkeypatch.setattr(hbird_cli, "hummingbird", refuse)
    monkeypatch.setattr(probe_cli, "linear_probe", refuse)
    monkeypatch.setattr(compare_cli, "evaluate_model", refuse)


@pytest.mark.parametrize("command", ["hbird", "linprobe", "compare"])
def test_a_layer_the_model_lacks_is_one_line_before_any_work(tmp_path, capsys, nothing_runs, command):
    model = ["--model", "vit_tiny_patch16_224"]
    batch = {"linprobe": ["--train-batch-size", "2"], "compare": ["--linprobe-batch-size", "2"]}.get(command, [])
    status = cli.main([command, *model, "--out", str(tmp_path / "out"), *DATA, *batch, "--layer", "20"])
    err = capsys.readouterr().err
    assert status == 1 and err == (
        f"locatdino {command}: --layer 20: vit_tiny_patch16_224 has 12 blocks (use 0 to 11, "
        "or -1 to -12 from the end)\n"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_negative_layer_counts_from_the_end(tmp_path, capsys):
    """``--layer -2`` was refused though the default is -1; it is the second-to-last block."""
    out = tmp_path / "out"
    assert (
        cli.main(["hbird", "--model", "vit_tiny_patch16_224", "--out", str(out), *DATA, "--k", "5", "--layer", "-2"])
        == 0
    )
    import json

    assert json.loads((out / "results.json").read_text())["models"][0]["config"]["layer"] == -2


@pytest.mark.parametrize("command", ["hbird", "linprobe", "compare"])
@pytest.mark.parametrize(
    "dataset, reader",
    [("pascal_context", "no Pascal Context tree under"), ("coco_stuff", "no COCO-Stuff-164k tree under")],
)
def test_every_command_reads_every_segmentation_dataset(tmp_path, capsys, command, dataset, reader):
    """hbird and compare lacked pascal_context / coco_stuff, which linprobe had."""
    model = ["--model", "vit_tiny_patch16_224"]
    with pytest.raises(SystemExit) as refused:
        cli.main(
            [
                command,
                *model,
                "--dataset",
                dataset,
                "--data-dir",
                str(tmp_path / "none"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert str(refused.value).startswith(f"locatdino {command}: {reader}")
