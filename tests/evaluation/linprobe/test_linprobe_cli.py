"""``locatdino linprobe`` through the dispatcher: outputs, provenance, errors in one line."""

import json

import pytest

from locatdino import cli
from locatdino.evaluation.image_confusions import CONFUSION_FILE, ImageConfusions
from tests.evaluation.results_schema import valid_results

SMALL = [
    "--dataset",
    "scenes",
    "--num-train",
    "6",
    "--num-val",
    "3",
    "--scene-size",
    "32",
    "--input-size",
    "32",
    "--iters",
    "6",
    "--train-batch-size",
    "4",
    "--train-augment",
    "off",
    "--precision",
    "fp32",
    "--workers",
    "0",
    "--no-progress",
]


def test_two_models_write_results_per_image_matrices_and_a_summary(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "linprobe",
        "--model",
        "vit_tiny_patch16_224",
        "--model",
        "locatvit_tiny_patch16_224",
        "--out",
        str(out),
        *SMALL,
    ]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "| vit_tiny_patch16_224 |" in table and "| locatvit_tiny_patch16_224 |" in table
    records = valid_results(out / "results.json", "linprobe")["models"]
    for label, result in zip(("vit_tiny_patch16_224", "locatvit_tiny_patch16_224"), records, strict=True):
        assert result["model"] == {"name": label, "checkpoint": None, "label": label, "pos_embed": "timm"}
        assert result["iterations"] == 6 and result["num_train"] == 6 and result["num_val"] == 3
        assert 0 <= result["miou"] <= 100 and len(result["per_class_iou"]) == 10
        assert result["features"]["cached"] is True and result["features"]["precision"] == "fp32"
        assert result["config"]["augment"] == "off" and result["config"]["dataset"] == "scenes"
        assert result["provenance"]["software"]["torch"] and result["provenance"]["checkpoint"] is None
        confusion = ImageConfusions.load(out / label / CONFUSION_FILE).dense()  # Hummingbird's file format
        assert confusion.shape == (3, 10, 10) and confusion.sum() == 3 * 32 * 32
    second = records[1]
    assert "differences" not in records[0] and second["differences"][""]["miou"]["resamples"] == 1000
    assert second["differences"][""]["miou"]["delta"] == pytest.approx(second["miou"] - records[0]["miou"], abs=1e-3)
    assert "# Dense linear probe" in (out / "report.md").read_text()


def test_errors_are_one_line_and_come_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(
        SystemExit, match=f"locatdino linprobe: --out {blocker / 'sub'} cannot be created: {blocker} is a file"
    ):
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(blocker / "sub"), *SMALL])
    assert "[linprobe]" not in capsys.readouterr().err
    with pytest.raises(SystemExit, match=f"^locatdino linprobe: --out {blocker} is a file, not a folder$"):
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(blocker), *SMALL])
    bad = tmp_path / "bad.pth"
    bad.write_text("placeholder\n")
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "linprobe",
                "--model",
                "vit_tiny_patch16_224:none",
                "--model",
                f"vit_tiny_patch16_224:{bad}",
                "--out",
                str(out),
                *SMALL,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"locatdino linprobe: {bad}: is a text file") and not out.exists()


def test_a_second_run_keeps_the_first_ones_results_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(out), *SMALL]
    assert cli.main(argv) == 0
    files = ("results.json", "report.md", f"vit_tiny_patch16_224/{CONFUSION_FILE}")
    first = {name: (out / name).read_bytes() for name in files}
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        cli.main([*argv, "--seed", "1"])
    assert str(refused.value) == (
        f"locatdino linprobe: --out {out} holds the output of an earlier run "
        "(results.json and 2 more): pass --overwrite to replace it, or choose another --out"
    )
    assert {name: (out / name).read_bytes() for name in first} == first and "[linprobe]" not in capsys.readouterr().err
    assert cli.main([*argv, "--seed", "1", "--overwrite"]) == 0
    assert json.loads((out / "results.json").read_text())["models"][0]["config"]["seed"] == 1


BUDGET_ERRORS = {
    "both budgets": (["--epochs", "2"], "argument --epochs: not allowed with argument --iters"),
    "iters below the schedule's minimum": (["--iters", "2"], "argument --iters: must be at least 5, got 2"),
    "negative lr": (["--lr", "-1"], "argument --lr: must be a positive number, got -1"),
    "nan lr": (["--lr", "nan"], "argument --lr: must be a positive number, got nan"),
    "negative weight decay": (["--weight-decay", "-0.1"], "argument --weight-decay: must be a number >= 0, got -0.1"),
}


@pytest.mark.parametrize("case", BUDGET_ERRORS, ids=list(BUDGET_ERRORS))
def test_budget_and_optimiser_settings_are_refused_at_parse_time(tmp_path, capsys, case):
    extra, expected = BUDGET_ERRORS[case]
    with pytest.raises(SystemExit) as done:
        cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "o"), *SMALL, *extra])
    assert done.value.code == 2
    assert capsys.readouterr().err == f"locatdino linprobe: {expected} (locatdino linprobe --help lists the options)\n"
    assert not (tmp_path / "o").exists()


def test_a_batch_larger_than_the_training_set_is_refused_before_any_model(tmp_path, capsys, monkeypatch):
    """``--train-batch-size 100000`` on 16 images was killed for memory after ~50 s."""
    from locatdino.evaluation import runner

    monkeypatch.setattr(runner, "load_backbones", lambda *a, **k: pytest.fail("built a model first"))
    with pytest.raises(
        SystemExit,
        match="batch size \\(--train-batch-size\\) 100000 is more than the 6 training images: use at most 6$",
    ):
        cli.main(
            [
                "linprobe",
                "--model",
                "vit_tiny_patch16_224",
                "--out",
                str(tmp_path / "o"),
                *SMALL,
                "--train-batch-size",
                "100000",
            ]
        )


def test_epochs_below_the_schedule_minimum_are_raised_with_a_note(tmp_path, capsys):
    i = SMALL.index("--iters")
    argv = SMALL[:i] + SMALL[i + 2 :]
    assert (
        cli.main(
            ["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "o"), *argv, "--epochs", "0.01"]
        )
        == 0
    )
    assert (
        "[linprobe] note: --epochs 0.01 is 1 iteration of 4 over 6 images; raised to 5, the OneCycle schedule's minimum"
    ) in capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "results.json").read_text())["models"][0]["iterations"] == 5


@pytest.mark.slow
def test_sigterm_stops_with_one_line_and_removes_the_feature_cache(tmp_path):
    """A SIGTERM once killed linprobe on the spot: no message, a kill's exit status, and its
    memory-mapped feature cache (tens of GB on ADE20K) left behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.mkdir()
    i = SMALL.index("--iters")
    argv = [*SMALL[:i], *SMALL[i + 2 :], "--iters", "1000000", "--cache-ram-mb", "0", "--cache-dir", str(cache)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "locatdino", "linprobe", "--model", "vit_tiny_patch16_224", "--out", str(out), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(cache.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1]
    time.sleep(0.5)  # into the training loop
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert (
        err.strip().splitlines()[-1] == "locatdino linprobe: stopped by SIGTERM (results finished before it are kept)"
    )
    assert "Traceback" not in err and list(cache.iterdir()) == [] and not (out / "results.json").exists()


@pytest.mark.slow
def test_a_feature_cache_left_by_a_killed_run_is_removed_by_the_next(tmp_path):
    import subprocess
    import sys

    from locatdino.evaluation.linprobe.feature_store import FeatureStore

    script = (
        "import os, sys; from locatdino.evaluation.linprobe.feature_store import FeatureStore; "
        "FeatureStore(4, 8, 2, 4, sys.argv[1], max_ram_bytes=0); os._exit(0)"
    )  # as a SIGKILL: no cleanup
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    [left] = list(tmp_path.iterdir())
    assert (left / "features.bin").is_file()
    store = FeatureStore(4, 8, 2, 4, tmp_path, max_ram_bytes=0)
    assert [p.name for p in tmp_path.iterdir()] == [store.folder.name]  # the dead run's cache is gone
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_second_linprobe_into_one_out_is_refused_while_the_first_runs(tmp_path, capsys, monkeypatch):
    """Two probes into one --out raced for the same results.json: the second is refused at once."""
    import os

    import locatdino.evaluation.linprobe.cli as linprobe
    from locatdino.common.output_files import output_lock

    monkeypatch.setattr(linprobe, "linear_probe", lambda *a, **k: pytest.fail("probed into a locked --out"))
    out = tmp_path / "out"
    with output_lock(out, "--out"):  # the first run, still probing
        assert cli.main(["linprobe", "--model", "vit_tiny_patch16_224", "--out", str(out), *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"locatdino linprobe: --out {out} is in use by another run (pid {os.getpid()} on "
    )
