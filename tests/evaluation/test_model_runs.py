"""The one model grammar of ``hbird``, ``linprobe`` and ``compare``: ``--model [LABEL=]NAME[:CHECKPOINT]``,
its labels, and the one-line hints for the forms of earlier versions."""

import pytest

from locatdino import cli
from locatdino.common.arguments import ArgumentParser, option_groups
from locatdino.evaluation.model_runs import ModelRun, add_model_arguments, add_retired_models, model_runs
from locatdino.models.model_spec import parse_model


def test_the_grammar_splits_at_the_first_colon():
    assert parse_model("vit_small_patch16_224") == (None, "vit_small_patch16_224", None)
    assert parse_model("vit_small_patch16_224:a/b.pth") == (None, "vit_small_patch16_224", "a/b.pth")
    assert parse_model("v=vit_small_patch16_224:a/b.pth") == ("v", "vit_small_patch16_224", "a/b.pth")
    assert parse_model("r=locatvit_tiny_patch16_224:none") == ("r", "locatvit_tiny_patch16_224", None)
    assert parse_model("r=locatvit_tiny_patch16_224:") == ("r", "locatvit_tiny_patch16_224", None)
    # a checkpoint path may hold ':' and '=' itself
    assert parse_model("vit_tiny:runs/a:b/lr=0.1.pth") == (None, "vit_tiny", "runs/a:b/lr=0.1.pth")
    assert parse_model("x=vit_tiny:s3:/c.pth") == ("x", "vit_tiny", "s3:/c.pth")
    for bad in ("", ":a.pth", "=vit_tiny", "x=", "x=:a.pth"):
        with pytest.raises(ValueError, match=r"expected \[LABEL=\]NAME\[:CHECKPOINT\]"):
            parse_model(bad)


def _runs(*argv: str) -> list[ModelRun]:
    parser = ArgumentParser(prog="locatdino hbird")
    group = option_groups(parser).model
    add_model_arguments(group)
    add_retired_models(group)
    return model_runs(parser.parse_args(list(argv)), parser)


def test_labels_default_to_the_name_and_checkpoint_and_repeat_with_a_count():
    runs = _runs(
        "--model",
        "vit_tiny_patch16_224",
        "--model",
        "vit_tiny_patch16_224:w/dino.pth",
        "--model",
        "vit_tiny_patch16_224:other/dino.pth",
        "--model",
        "b=locatvit_tiny_patch16_224:x y.pth",
        "--pos-embed",
        "timm",
    )
    assert [r.label for r in runs] == [
        "vit_tiny_patch16_224",
        "vit_tiny_patch16_224-dino",
        "vit_tiny_patch16_224-dino-2",
        "b",
    ]
    assert runs[3] == ModelRun("b", "locatvit_tiny_patch16_224", "x y.pth", "timm")
    assert [r.label for r in _runs("--model", "vit_tiny:a b.pth")] == ["vit_tiny-a_b"]  # a folder name
    # a derived label does not take a name given as LABEL
    assert [r.label for r in _runs("--model", "vit_tiny", "--model", "vit_tiny=locatvit_tiny_patch16_224")] == [
        "vit_tiny-2",
        "vit_tiny",
    ]


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


@pytest.mark.parametrize("command", ["hbird", "linprobe"])
def test_the_retired_checkpoint_option_says_what_to_write(capsys, command):
    assert _refused(capsys, [command, "--model", "locatvit_tiny_patch16_224", "--checkpoint", "path/to.pth"]) == (
        f"locatdino {command}: --checkpoint is gone: write --model locatvit_tiny_patch16_224:path/to.pth"
    )
    assert _refused(capsys, [command, "--model", "a", "--model", "b", "--checkpoint", "x"]) == (
        f"locatdino {command}: --checkpoint is gone: write --model NAME:CHECKPOINT (e.g. --model "
        "locatvit_tiny_patch16_224:path/to.pth)"
    )


def test_compare_s_positional_models_say_what_to_write(capsys):
    assert _refused(
        capsys, ["compare", "vit=vit_tiny_patch16_224", "locat=locatvit_tiny_patch16_224:c.pth", "--no-linprobe"]
    ) == (
        "locatdino compare: models are given with --model: write --model vit=vit_tiny_patch16_224 "
        "--model locat=locatvit_tiny_patch16_224:c.pth"
    )
    assert _refused(capsys, ["compare", "--model", "vit_tiny_patch16_224", "stray"]) == (
        "locatdino compare: unrecognized arguments: stray (locatdino compare --help lists the options)"
    )


@pytest.mark.parametrize("command", ["hbird", "linprobe", "compare"])
def test_model_problems_are_one_line_usage_errors(capsys, command):
    assert _refused(capsys, [command]) == (
        f"locatdino {command}: the following arguments are required: --model (locatdino {command} --help lists the "
        "options)"
    )
    assert _refused(
        capsys, [command, "--model", "a=vit_tiny_patch16_224", "--model", "a=locatvit_tiny_patch16_224"]
    ) == (f"locatdino {command}: --model label 'a' is given twice: give each run its own label")
    assert _refused(capsys, [command, "--model", "a/b=vit_tiny_patch16_224"]).startswith(
        f"locatdino {command}: --model label 'a/b'"
    )
    assert _refused(capsys, [command, "--model", "=vit_tiny_patch16_224"]).startswith(
        f"locatdino {command}: --model '=vit_tiny_patch16_224': expected [LABEL=]NAME[:CHECKPOINT]"
    )
    assert _refused(
        capsys,
        [command, "--model", "a", "--model", "b", "--pos-embed", "dino", "--pos-embed", "timm", "--pos-embed", "auto"],
    ) == (f"locatdino {command}: 2 --model but 3 --pos-embed (give one for all models or one per model)")
