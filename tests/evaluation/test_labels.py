"""One label check for every command that names runs (``--model LABEL=...``, ``hbird report --label``)."""

import json
import re

import pytest

from locatdino import cli
from locatdino.evaluation.labels import check_labels
from locatdino.evaluation.results import results_document


@pytest.mark.parametrize(
    "label, problem",
    [
        ("a|b", "holds |: a label names its run's folder and table row"),
        ("a/b", "holds /:"),
        ("a\\b", "holds \\\\:"),
        ("a\nb", "holds \\n:"),
        ("..", "starts with '.'"),
        (".locatdino.lock", "starts with '.'"),
        (" a", "starts with '.' or a space"),
        ("x" * 101, "is 101 characters long: at most 100"),
        ("Summary.MD", "is the name of a file the command writes into its output folder"),
    ],
)
def test_labels_that_break_files_or_tables_are_refused(label, problem):
    with pytest.raises(ValueError) as refused:
        check_labels(["ok", label], "--model", reserved=("summary.md", "results.json"))
    assert str(refused.value).startswith(f"--model label {label!r} {problem}"), str(refused.value)


def test_duplicates_are_refused_also_when_they_differ_in_case_only():
    check_labels(["a", "b", "a-2"], "--label")
    with pytest.raises(ValueError, match="^--label label 'a' is given twice: give each run its own label$"):
        check_labels(["a", "b", "a"], "--label")
    with pytest.raises(ValueError, match="^--model labels 'vit' and 'ViT' differ in case only"):
        check_labels(["vit", "ViT"], "--model")


def _refused(capsys, argv):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


@pytest.mark.parametrize(
    "command, own",
    [
        ("hbird", "report.md"),
        ("linprobe", "results.json"),
        ("knn", "Results.json"),
        ("lincls", "report.md"),
        ("compare", "report.md"),
    ],
)
def test_every_command_refuses_its_own_file_names_and_separators_before_any_work(tmp_path, capsys, command, own):
    """LABEL summary.md evaluated every model, then failed on '[Errno 21] Is a directory'; a '|'
    shifted every later column of summary.md."""
    base = ["--out", str(tmp_path / "out")]
    assert _refused(capsys, [command, "--model", f"{own}=vit_tiny_patch16_224", *base]) == (
        f"locatdino {command}: --model label {own!r} is the name of a file the command writes into its output "
        "folder: choose another label"
    )
    assert _refused(capsys, [command, "--model", ".locatdino.lock=vit_tiny_patch16_224", *base]).startswith(
        f"locatdino {command}: --model label '.locatdino.lock' starts with '.'"
    )
    assert _refused(capsys, [command, "--model", "a|b=vit_tiny_patch16_224", *base]).startswith(
        f"locatdino {command}: --model label 'a|b' holds |"
    )
    assert _refused(
        capsys, [command, "--model", "A=vit_tiny_patch16_224", "--model", "a=locatvit_tiny_patch16_224", *base]
    ) == (
        f"locatdino {command}: --model labels 'A' and 'a' differ in case only (one folder on a case-insensitive "
        "file system): give each run its own label"
    )
    assert not (tmp_path / "out").exists()


def test_derived_labels_that_differ_in_case_only_are_numbered():
    from locatdino.common.arguments import ArgumentParser, option_groups
    from locatdino.evaluation.model_runs import add_model_arguments, model_runs

    parser = ArgumentParser(prog="locatdino hbird")
    add_model_arguments(option_groups(parser).model)
    args = parser.parse_args(
        ["--model", "vit_tiny_patch16_224:runs/A.pth", "--model", "vit_tiny_patch16_224:runs/a.pth"]
    )
    assert [run.label for run in model_runs(args, parser)] == ["vit_tiny_patch16_224-A", "vit_tiny_patch16_224-a-2"]


def test_hbird_report_labels_are_checked_like_model_labels(tmp_path, capsys):
    """``hbird report --label a --label a`` gave two rows named a."""
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        record = {
            "miou": 40.0,
            "model": {"label": name, "name": "m", "checkpoint": None},
            "scores": {},
            "config": {},
            "provenance": {},
        }
        (tmp_path / name / "results.json").write_text(json.dumps(results_document("c", "hbird", [record])))
    with pytest.raises(
        SystemExit, match="^locatdino hbird report: --label label 'a' is given twice: give each run its own label$"
    ):
        cli.main(["hbird", "report", str(tmp_path), "--label", "a", "--label", "a"])
    with pytest.raises(SystemExit, match=re.escape("locatdino hbird report: --label label 'a|1' holds |")):
        cli.main(["hbird", "report", str(tmp_path), "--label", "a|1", "--label", "b"])


def test_a_run_folder_named_with_a_bar_shifts_no_column():
    from locatdino.evaluation.tables import per_class_table

    table = per_class_table(
        [{"label": "runs/a|b", "per_class_iou": {"sky": 50.0}}, {"label": "c", "per_class_iou": {"sky": 40.0}}]
    )
    head, _, row = table.splitlines()
    assert head == "| class | runs/a\\|b | c | Δ |" and row.count("|") == 5  # class, two runs, Δ
