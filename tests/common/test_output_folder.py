"""The one overwrite rule (locatdino.common.output_folder): earlier output is what a run recorded writing."""

import json
import os

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


def _record(out):
    return json.loads((out / RECORD_NAME).read_text())


def _save_record(out, record):
    (out / RECORD_NAME).write_text(json.dumps(record))


def test_the_record_keeps_each_files_size_and_modification_time_and_a_rewrite_updates_them(tmp_path):
    out = tmp_path / "out"
    folder = OutputFolder(out, "knn")
    folder.check(["results.json"], False)
    with folder.writing(False):
        folder.write_text("results.json", "one model")
        folder.write_text("results.json", "two models, written again")  # knn writes after each model
    info = os.stat(out / "results.json")
    assert _record(out) == {
        "command": "knn",
        "files": {"results.json": {"size": len("two models, written again"), "mtime_ns": info.st_mtime_ns}},
    }
    _run(out, {"summary.md": "x"}, overwrite=True, command="knn")  # the rewritten file is still the run's
    assert not (out / "results.json").exists()


def _damage_cases(tmp_path, out):
    """Entries of a damaged or edited record, each naming a file of the user's (``victim``)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's, outside --out")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "victim.txt").write_text("the user's, behind a link")
    (out / "link").symlink_to(tmp_path / "elsewhere")
    return {
        str(victim): ("an absolute path", victim),
        "../victim.txt": ("a path through '..'", victim),
        "sub/../../victim.txt": ("a path through '..'", victim),
        "link/victim.txt": ("reached through the symbolic link link", tmp_path / "elsewhere" / "victim.txt"),
        ".locatdino.lock": ("the folder's own bookkeeping file", out / ".locatdino.lock"),
        RECORD_NAME: ("the folder's own bookkeeping file", out / RECORD_NAME),
    }


@pytest.mark.parametrize(
    "entry", ["absolute", "../victim.txt", "sub/../../victim.txt", "link/victim.txt", ".locatdino.lock", RECORD_NAME]
)
def test_a_damaged_record_removes_nothing_and_is_refused_naming_the_entry(tmp_path, entry):
    out = tmp_path / "out"
    _run(out, {"results.json": "first"})
    (out / ".locatdino.lock").touch()  # the lock file a run leaves
    cases = _damage_cases(tmp_path, out)
    entry = str(tmp_path / "victim.txt") if entry == "absolute" else entry
    why, victim = cases[entry]
    record = _record(out)
    info = os.stat(victim)  # the victim's own size and time: only the name can make it refused
    record["files"][entry] = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    _save_record(out, record)
    before = victim.read_bytes()
    expected = (
        f"--out {out} holds a damaged record {out / RECORD_NAME}: it lists {entry!r}, {why} (a run removes only "
        "files inside --out reached without a link): nothing was removed, choose another --out"
    )
    for overwrite in (False, True):
        with pytest.raises(UserError) as refused:
            _run(out, {"results.json": "second"}, overwrite=overwrite)
        assert str(refused.value) == expected
    assert victim.read_bytes() == before and (out / "results.json").read_text() == "first"


def test_an_older_record_without_sizes_is_still_read(tmp_path):
    """Names only: a file no newer than the record is the run's; one put there later is refused."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("results.json", "summary.md"):
        (out / name).write_text("earlier run")
        os.utime(out / name, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    _save_record(out, {"command": "hbird", "files": ["results.json", "summary.md", "gone.json"]})
    os.utime(out / RECORD_NAME, ns=(1_000_000_001_000_000_000, 1_000_000_001_000_000_000))
    assert OutputFolder(out, "hbird").earlier() == ["results.json", "summary.md"]
    os.utime(out / "summary.md", ns=(1_000_000_002_000_000_000, 1_000_000_002_000_000_000))  # the user's, later
    with pytest.raises(UserError, match="^--out .* holds summary.md, which an earlier run of locatdino hbird wrote"):
        _run(out, {"results.json": "new"}, overwrite=True)
    assert (out / "results.json").read_text() == "earlier run" and (out / "summary.md").exists()
    os.utime(out / "summary.md", ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    _run(out, {"results.json": "new"}, overwrite=True)
    assert (out / "results.json").read_text() == "new" and not (out / "summary.md").exists()


@pytest.mark.parametrize("change", ["rewritten", "same size, touched", "a link", "a folder"])
def test_a_recorded_file_changed_since_is_refused_not_removed(tmp_path, change):
    out = tmp_path / "out"
    _run(out, {"results.json": "first", "summary.md": "first"})
    mine = tmp_path / "mine.md"
    mine.write_text("the user's notes")
    (out / "summary.md").unlink()
    if change == "rewritten":
        (out / "summary.md").write_text("the user's own summary")
    elif change == "same size, touched":
        (out / "summary.md").write_text("first")
        os.utime(out / "summary.md", ns=(1, 1))
    elif change == "a link":
        (out / "summary.md").symlink_to(mine)
    else:
        (out / "summary.md").mkdir()
        (out / "summary.md" / "notes.md").write_text("the user's")
    for overwrite in (False, True):
        with pytest.raises(UserError) as refused:
            _run(out, {"results.json": "second"}, overwrite=overwrite)
        assert str(refused.value) == (
            f"--out {out} holds summary.md, which an earlier run of locatdino hbird wrote but which has changed "
            "since (its size, modification time or kind): move it away or choose another --out (a run removes "
            "only the files it wrote, as it left them)"
        )
    assert os.path.lexists(out / "summary.md") and mine.read_text() == "the user's notes"
    assert (out / "results.json").read_text() == "first"  # nothing removed: every file is checked first


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_a_record_that_is_not_a_file_is_refused(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    if kind == "folder":
        (out / RECORD_NAME).mkdir()
    else:
        (tmp_path / "record.json").write_text(json.dumps({"command": "hbird", "files": []}))
        (out / RECORD_NAME).symlink_to(tmp_path / "record.json")
    with pytest.raises(UserError) as refused:
        OutputFolder(out, "hbird").check(["results.json"], overwrite=True)
    assert str(refused.value) == (
        f"--out {out} holds {out / RECORD_NAME}, which is not a file (a folder or a link): choose another --out"
    )
