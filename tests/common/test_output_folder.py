"""The one overwrite rule (locatdino.common.output_folder): earlier output is what a run recorded writing."""

import pytest

from locatdino.common.errors import UserError
from locatdino.common.output_folder import RECORD_NAME, OutputFolder


def _run(path, files, overwrite=False, command="hbird"):
    """One run of ``command`` writing ``files`` (relative name -> text) into ``path``."""
    folder = OutputFolder(path, command)
    folder.check(list(files), overwrite)
    with folder.writing(overwrite):
        for name, text in files.items():
            folder.write_text(name, text)
    return folder


def test_a_second_run_is_refused_without_overwrite_and_keeps_the_first(tmp_path):
    out = tmp_path / "out"
    _run(out, {"results.json": "first", "summary.md": "first"})
    with pytest.raises(UserError) as refused:
        _run(out, {"results.json": "second"})
    assert str(refused.value) == (
        f"--out {out} holds the output of an earlier run (results.json and 1 more): "
        "pass --overwrite to replace it, or choose another --out"
    )
    assert (out / "results.json").read_text() == "first"


def test_overwrite_removes_every_file_of_the_earlier_run(tmp_path):
    """A one-model run, then a two-model run: the first run's results.json must not stay beside
    the new per-model folders (a report would read it as a third run)."""
    out = tmp_path / "out"
    _run(out, {"results.json": "one model", "summary.md": "one model"})
    (out / "notes.txt").write_text("the user's")
    _run(out, {"a/results.json": "a", "b/results.json": "b", "summary.md": "two"}, overwrite=True)
    found = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".locatdino.lock")
    assert found == [RECORD_NAME, "a/results.json", "b/results.json", "notes.txt", "summary.md"]
    assert (out / "notes.txt").read_text() == "the user's"
    assert OutputFolder(out, "hbird").earlier() == ["a/results.json", "b/results.json", "summary.md"]
    _run(out, {"results.json": "one again"}, overwrite=True)  # the emptied run folders go too
    assert not (out / "a").exists() and not (out / "b").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_no_run_recorded_is_never_replaced_whatever_its_shape(tmp_path, overwrite):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"miou": 40.0}')  # looks like ours, was not written by a run
    with pytest.raises(
        UserError,
        match=f"^--out {out} holds results.json, which locatdino hbird did not write: "
        r"move it or choose another --out \(a run replaces only files it wrote\)$",
    ):
        _run(out, {"results.json": "new"}, overwrite)
    assert (out / "results.json").read_text() == '{"miou": 40.0}'


def test_a_file_where_a_run_folder_goes_and_files_in_an_owned_folder_are_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("x")
    with pytest.raises(UserError, match="holds a, which locatdino hbird did not write"):
        OutputFolder(out, "hbird").check(["a/results.json"], overwrite=True)
    (out / "figures").mkdir()
    (out / "figures" / "mine.png").write_bytes(b"png")
    with pytest.raises(UserError, match="holds figures/mine.png, which locatdino compare did not write"):
        OutputFolder(out, "compare").check(["figures/"], overwrite=True)


def test_another_commands_output_is_refused_even_with_overwrite(tmp_path):
    out = tmp_path / "out"
    _run(out, {"report.md": "compare's"}, command="compare")
    with pytest.raises(UserError, match=f"^--out {out} holds the output of locatdino compare: choose another --out$"):
        _run(out, {"results.json": "x"}, overwrite=True)


def test_a_refused_or_unwritable_folder_is_not_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot be created: .*file is a file"):
        OutputFolder(tmp_path / "file" / "out", "hbird").check(["results.json"], False)
    assert not (tmp_path / "file").is_dir()
    with pytest.raises(UserError, match="is a file, not a folder"):
        OutputFolder(tmp_path / "file", "hbird").check(["results.json"], False)
