import json
import struct

import numpy as np
import pytest

from locatdino.common.output_files import atomic_write_text
from locatdino.evaluation.bootstrap import miou_interval
from locatdino.evaluation.hbird.report import (
    HBIRD_LAYOUT,
    differing_settings,
    incompatibilities,
    label_by_folder,
    load_results,
)
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions
from locatdino.evaluation.metric import images_miou
from locatdino.evaluation.results import report_markdown, results_document, results_table, score
from locatdino.evaluation.tables import per_class_table


def _write_run(record, folder, confusions=None):
    """A finished one-model ``locatdino hbird`` run in ``folder``, as the command leaves it."""
    label = record["model"]["label"]
    if confusions is not None:
        (folder / label).mkdir(parents=True)
        confusions.save(folder / label / CONFUSION_FILE)
        record["per_image_confusion"] = f"{label}/{CONFUSION_FILE}"
    document = results_document("locatdino hbird", "hbird", [record])
    atomic_write_text(folder / "report.md", report_markdown(document, HBIRD_LAYOUT))
    return atomic_write_text(folder / "results.json", json.dumps(document))


def _result(label, miou, classes=(("a", 50.0), ("b", None))):
    return {
        "scores": {"": {"miou": score(miou), "miou_matched": score(miou + 1), "pixel_accuracy": score(80.0)}},
        "miou": miou,
        "miou_matched": miou + 1,
        "pixel_accuracy": 80.0,
        "per_class_iou": dict(classes),
        "memory_patches": 12345,
        "memory_bytes": 1,
        "num_train": 3,
        "num_val": 2,
        "skipped": 0,
        "timings": {"features": 1.0, "search": 2.0, "total": 4.0},
        "peak_rss_mb": 900.0,
        "config": {"dataset": "scenes", "input_size": 224, "k": 30},
        "provenance": {},
        "model": {"name": "m", "label": label},
    }


def test_write_and_compare(tmp_path):
    _write_run(_result("vit", 40.0), tmp_path / "vit")
    _write_run(_result("locatvit", 42.5, (("a", 55.0), ("b", None))), tmp_path / "locatvit")
    assert json.loads((tmp_path / "vit" / "results.json").read_text())["models"][0]["miou"] == 40.0
    assert "| vit | 40.00 | — | 41.00 | — | 80.00 | 12,345 |" in (tmp_path / "vit" / "report.md").read_text()
    results = load_results([tmp_path])  # found recursively, sorted by path
    assert [r["model"]["label"] for r in results] == ["locatvit", "vit"]
    table = per_class_table(results[::-1])
    assert "| a | 50.00 | 55.00 | +5.00 |" in table and "| b | – | – | – |" in table
    assert results_table(results_document("c", "hbird", results), HBIRD_LAYOUT).count("\n") == 3


def test_load_results_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        load_results([tmp_path])
    atomic_write_text(tmp_path / "results.json", "{}")
    with pytest.raises(ValueError, match="results.json: not a results.json of locatdino-evaluation/1"):
        load_results([tmp_path / "results.json"])
    atomic_write_text(tmp_path / "results.json", json.dumps(_result("old", 40.0)))  # an earlier version's layout
    with pytest.raises(ValueError, match="written by an earlier version .* rerun the command"):
        load_results([tmp_path / "results.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary files left


def test_runs_are_labelled_by_their_run_folder(tmp_path):
    for folder in ("a/vit", "b/vit", "c/locatvit"):
        _write_run(_result("ignored", 40.0), tmp_path / folder)
    results = load_results([tmp_path])
    assert label_by_folder(results) == ["a/vit", "b/vit", "locatvit"]
    assert label_by_folder(results[:1] + results[2:]) == ["vit", "locatvit"]


def test_incompatible_runs_are_named(tmp_path):
    base = _result("x", 40.0)
    other_data = {**base, "config": {**base["config"], "dataset": "voc"}}
    fewer = {**base, "num_val": 5}
    classes = _result("x", 40.0, (("a", 1.0), ("c", 2.0)))
    whole = [{**base, "config": {**base["config"], "dataset": "voc", "seed": s, "query_seed": None}} for s in (0, 1)]
    assert incompatibilities(whole) == [] and differing_settings(whole) == ["seed 0 vs 1"]  # memory views only
    assert incompatibilities([base, other_data, fewer, classes]) == [
        'dataset "scenes" vs "voc"',
        "num_val 2 vs 5",
        "class lists differ",
    ]


def test_report_refuses_mixed_runs_and_labels_the_rest(tmp_path, capsys):
    from locatdino.evaluation.hbird import cli

    _write_run(_result("m", 40.0), tmp_path / "runs" / "base")
    larger = _result("m", 41.0)
    larger["config"]["input_size"] = 448
    _write_run(larger, tmp_path / "runs" / "seed7")
    assert cli.main(["report", str(tmp_path / "runs"), "--summary", str(tmp_path / "cmp.md")]) == 0
    captured = capsys.readouterr()
    assert "| base | 40.00 |" in captured.out and "| seed7 | 41.00 |" in captured.out
    assert captured.err.strip().splitlines() == [
        "locatdino hbird report: warning: input_size 224 vs 448",
        "locatdino hbird report: warning: no Δ mIoU interval for base, seed7: no per-image confusion matrices",
    ]
    assert "| seed7 | 41.00 | — |" in captured.out
    assert "- input_size: 224, 448  ⚠ differs between runs" in (tmp_path / "cmp.md").read_text()
    assert cli.main(["report", str(tmp_path / "runs"), "--label", "A", "--label", "B"]) == 0
    assert "| A | 40.00 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"^locatdino hbird report: 1 --label for 2 runs"):
        cli.main(["report", str(tmp_path / "runs"), "--label", "A"])

    voc = _result("m", 30.0)
    voc["config"]["dataset"] = "voc"
    _write_run(voc, tmp_path / "runs" / "voc")
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(tmp_path / "runs")])
    assert str(refused.value) == (
        'locatdino hbird report: the runs scored different query images (dataset "scenes" '
        'vs "voc"); compare like with like, or pass --allow-mixed'
    )
    assert cli.main(["report", str(tmp_path / "runs"), "--allow-mixed", "--summary", str(tmp_path / "mixed.md")]) == 0
    text = (tmp_path / "mixed.md").read_text()
    assert "Dataset: mixed ⚠" in text and '⚠ Not comparable, scored on different query images: dataset "scenes"' in text


def test_report_gives_each_delta_its_paired_interval(tmp_path, capsys):
    from locatdino.evaluation.hbird import cli

    rng = np.random.default_rng(0)
    target = rng.integers(0, 2, (30, 50))
    matrices = {}
    for name, accuracy in (("a", 0.5), ("b", 0.9)):
        pred = np.where(rng.random(target.shape) < accuracy, target, 1 - target)
        matrices[name] = np.stack([np.bincount(t * 2 + q, minlength=4).reshape(2, 2) for t, q in zip(target, pred)])
    matrices["itself"] = matrices["a"]
    scores = {}
    for name, m in matrices.items():
        confusions = ImageConfusions.from_matrices(m)
        scores[name] = images_miou(confusions)  # the stored figure must be its matrices' (report checks)
        _write_run(_result(name, scores[name]), tmp_path / "runs" / name, confusions)
    record = json.loads((tmp_path / "runs" / "a" / "results.json").read_text())["models"][0]
    assert record["per_image_confusion"] == f"a/{CONFUSION_FILE}"
    assert (
        cli.main(
            [
                "report",
                *(str(tmp_path / "runs" / n) for n in ("a", "b", "itself")),
                "--summary",
                str(tmp_path / "cmp.md"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    loaded = [ImageConfusions.load(tmp_path / "runs" / n / n / CONFUSION_FILE) for n in ("a", "b")]
    assert f"| b | {scores['b']:.2f} | {miou_interval(loaded[1], loaded[0]).text()} |" in out
    assert miou_interval(loaded[1], loaded[0]).low > 0  # 90 % vs 50 % of the pixels right
    assert (
        f"| itself | {scores['a']:.2f} | +0.00 [+0.00, +0.00] | {scores['a'] + 1:.2f} | +0.00 [+0.00, +0.00] |" in out
    )
    from locatdino.evaluation.bootstrap import matched_miou_interval

    assert f"| {matched_miou_interval(loaded[1], loaded[0]).text()} | 80.00 |" in out  # b's matched Δ
    assert "Δ = model − first model with its 95 % paired-bootstrap interval" in (tmp_path / "cmp.md").read_text()


def test_comparison_flags_runs_from_different_machines_or_software(tmp_path):
    a, b = _result("vit", 40.0), _result("locatvit", 42.0)
    cpu = {"model": "AMD EPYC", "flags": {"avx512f": True}}
    a["provenance"] = {"cpu": cpu, "gpus": [], "software": {"torch": "2.5.0", "faiss": "1.9"}}
    b["provenance"] = {
        "cpu": {**cpu, "model": "Intel Xeon"},
        "gpus": [],
        "software": {"torch": "2.5.0", "faiss": "1.9"},
    }
    lines = report_markdown(results_document("c", "hbird", [a, b]), HBIRD_LAYOUT).splitlines()
    assert '- cpu: "AMD EPYC", "Intel Xeon"  ⚠ differs between runs' in lines
    assert '- torch: "2.5.0"' in lines and "- gpus: []" in lines
    old = _result("old", 1.0)  # written before results carried provenance
    assert "- cpu: null" in report_markdown(results_document("c", "hbird", [old]), HBIRD_LAYOUT).splitlines()


@pytest.mark.parametrize("recorded", [True, False])
def test_runs_whose_seed_picked_other_queries_are_refused(tmp_path, recorded):
    """The seed renders the built-in scenes and draws a split's subset: runs of --seed 0 and 1
    scored different query images (also in results.json files written before query_seed was)."""
    from locatdino.evaluation.hbird import cli

    for seed in (0, 1):
        run = _result("m", 40.0 + seed)
        run["config"].update(seed=seed, **({"query_seed": seed} if recorded else {}))
        _write_run(run, tmp_path / "runs" / f"seed{seed}")
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(tmp_path / "runs")])
    assert str(refused.value) == (
        "locatdino hbird report: the runs scored different query images (query_seed 0 "
        "vs 1); compare like with like, or pass --allow-mixed"
    )


def test_report_summary_never_replaces_an_input_and_its_own_only_with_overwrite(tmp_path, capsys):
    from locatdino.evaluation.hbird import cli

    results = _write_run(_result("m", 40.0), tmp_path / "run")
    before, own = results.read_text(), (tmp_path / "run" / "report.md").read_text()
    (tmp_path / "notes.md").write_text("# Hummingbird, my notes")  # its shape does not make it a report's
    for target in (results, tmp_path / "notes.md", tmp_path / "run" / "report.md"):  # an input run's own too
        for overwrite in ([], ["--overwrite"]):
            with pytest.raises(
                SystemExit,
                match=f"^locatdino hbird report: --summary {target} exists and was not "
                "written by locatdino hbird report: choose another file$",
            ):
                cli.main(["report", str(results), "--summary", str(target), *overwrite])
    assert results.read_text() == before and (tmp_path / "notes.md").read_text() == "# Hummingbird, my notes"
    assert (tmp_path / "run" / "report.md").read_text() == own
    assert cli.main(["report", str(results), "--summary", str(tmp_path / "cmp.md")]) == 0
    with pytest.raises(SystemExit, match="holds the output of an earlier run: pass --overwrite to replace it"):
        cli.main(["report", str(results), "--summary", str(tmp_path / "cmp.md")])
    assert cli.main(["report", str(results), "--summary", str(tmp_path / "cmp.md"), "--overwrite"]) == 0


def _run_with_matrices(folder, **changes):
    matrices = np.array([[[5, 1], [0, 4]], [[3, 0], [2, 5]]])
    confusions = ImageConfusions.from_matrices(matrices)
    path = _write_run(_result("m", images_miou(confusions)), folder, confusions)
    document = json.loads(path.read_text())
    document["models"][0].update(changes)  # an edited or damaged file
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    "stored, expected",
    [
        ("abc", "miou is 'abc', not a number"),
        (None, "miou is None, not a number"),
        (float("nan"), "miou nan is not a percentage in [0, 100]"),
        (1e308, "miou 1e+308 is not a percentage in [0, 100]"),
        (-3.0, "miou -3 is not a percentage in [0, 100]"),
    ],
)
def test_report_refuses_a_stored_score_that_is_no_percentage(tmp_path, stored, expected):
    """A NaN mIoU showed as '–', 1e308 as a 309-digit number, a string as "Unknown format code 'f'"."""
    from locatdino.evaluation.hbird import cli

    results = _run_with_matrices(tmp_path / "run", miou=stored)
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(results)])
    assert str(refused.value) == f"locatdino hbird report: {results}: {expected}"


def test_report_checks_the_stored_miou_against_the_runs_own_matrices(tmp_path, capsys):
    from locatdino.evaluation.hbird import cli

    results = _run_with_matrices(tmp_path / "run")
    assert cli.main(["report", str(results)]) == 0
    data = json.loads(results.read_text())
    true_miou = data["models"][0]["miou"]
    data["models"][0]["miou"] = true_miou + 5
    results.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(results)])
    assert str(refused.value) == (
        f"locatdino hbird report: {results}: miou {true_miou + 5:.4f} but its per-image "
        f"matrices ({CONFUSION_FILE}) give {true_miou:.4f}: an edited results.json, or "
        "matrices of another run"
    )


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("garbage", "not a per-image confusion file (not an .npz archive)"),
        ("image index", "damaged per-image confusion file (image index 7 outside [0, 2))"),
        ("cell index", "damaged per-image confusion file (cell index 99 outside [0, 4))"),
        ("missing key", "not a per-image confusion file ('count is not a file in the archive')"),
        ("broken directory", "not a per-image confusion file (Bad magic number for central directory)"),
    ],
)
def test_damaged_confusion_files_are_named_in_one_line(tmp_path, damage, expected):
    """A garbage file was called "pickled data"; out-of-range indices raised a bare IndexError."""
    from locatdino.evaluation.hbird import cli

    results = _run_with_matrices(tmp_path / "run")
    path = tmp_path / "run" / "m" / CONFUSION_FILE
    if damage == "garbage":
        path.write_bytes(b"\x80\x04 not numpy at all")
    elif damage == "broken directory":  # a zip's end record pointing at a central directory that is not one
        path.write_bytes(b"X" * 46 + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, 46, 0, 0))
    else:
        with np.load(path) as data:
            arrays = dict(data)
        if damage == "missing key":
            del arrays["count"]
        else:
            key = damage.split()[0]
            arrays[key] = arrays[key].copy()
            arrays[key][0] = 7 if key == "image" else 99
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(results)])
    assert str(refused.value) == f"locatdino hbird report: {path}: {expected}".replace("\\'", "'")


@pytest.mark.parametrize("name", ["results.json", CONFUSION_FILE])
@pytest.mark.parametrize(
    "kind, expected",
    [
        ("fifo", "is a FIFO, not a"),
        ("/dev/zero", "is a character device, not a"),
        ("huge", "holds more than"),
    ],
)
def test_a_fifo_a_device_or_a_huge_file_is_refused_not_read(tmp_path, name, kind, expected):
    """``open`` of a FIFO waited for a writer forever, ``/dev/zero`` was read forever, a huge
    results.json went whole into ``json.loads``."""
    import os
    import signal

    from locatdino.evaluation.hbird import cli
    from locatdino.evaluation.hbird.report import MAX_RESULTS_BYTES
    from locatdino.evaluation.image_confusions import MAX_BYTES

    results = _run_with_matrices(tmp_path / "run")
    path = tmp_path / "run" / (name if name == "results.json" else f"m/{name}")
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:  # sparse: no disk is used
            f.truncate((MAX_RESULTS_BYTES if name == "results.json" else MAX_BYTES) + 1)

    def hung(*_):
        raise TimeoutError(f"hbird report hung on {kind} {name}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with pytest.raises(SystemExit) as refused:
            cli.main(["report", str(results)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    what = "Hummingbird results.json" if name == "results.json" else "per-image confusion file"
    message = str(refused.value)
    assert message.startswith(f"locatdino hbird report: {path} {expected}") and message.count(what) == 1, message
    assert "\n" not in message


def test_a_confusion_file_whose_arrays_unpack_too_large_is_refused(tmp_path, monkeypatch):
    import locatdino.evaluation.image_confusions as image_confusions

    path = tmp_path / CONFUSION_FILE
    with open(path, "wb") as f:  # 8 MB of zeros, about 8 kB compressed
        np.savez_compressed(
            f,
            num_classes=2,
            class_mask=np.ones(2, bool),
            num_images=1,
            image=np.zeros(10**6, np.int64),
            cell=np.zeros(1, np.int64),
            count=np.zeros(1, np.int64),
        )
    monkeypatch.setattr(image_confusions, "MAX_BYTES", 2**20)
    assert path.stat().st_size < 2**20
    with pytest.raises(
        ValueError,
        match=r"its arrays unpack to 8 MiB, more than a per-image confusion file ever "
        r"holds \(1 MiB\)",
    ):
        ImageConfusions.load(path)


def test_an_edited_record_or_a_matrix_file_outside_the_run_is_one_line(tmp_path):
    """A record without its config was a KeyError; a matrix path could point anywhere on the disk."""
    from locatdino.evaluation.hbird import cli

    results = _run_with_matrices(tmp_path / "run")
    document = json.loads(results.read_text())
    del document["models"][0]["config"]
    results.write_text(json.dumps(document))
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(results)])
    assert str(refused.value) == f"locatdino hbird report: {results}: model record 0 has no config"
    outside = _run_with_matrices(tmp_path / "other", per_image_confusion=f"../run/m/{CONFUSION_FILE}")
    with pytest.raises(SystemExit) as refused:
        cli.main(["report", str(outside)])
    assert str(refused.value) == (
        f"locatdino hbird report: {outside}: per_image_confusion '../run/m/{CONFUSION_FILE}' points outside "
        f"its folder {tmp_path / 'other'}"
    )
