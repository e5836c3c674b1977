import importlib
import os
import re
import subprocess
import sys
import types

import pytest

import locatdino
from locatdino import cli
from locatdino.common.errors import DEBUG_ENV, UserError, first_line, one_line
from locatdino.common.threads import pop_threads


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"  {name}" in out
    fit_line = next(line for line in out.splitlines() if line.startswith("  fit "))
    assert all(objective in fit_line for objective in ("DINO", "iBOT", "distillation", "supervised")), fit_line


def test_unknown_command_exits_2(capsys):
    assert cli.main(["no-such-command"]) == 2
    assert capsys.readouterr().err == (
        "locatdino: unknown command 'no-such-command' (one of demo, fit, export, "
        "shards, hbird, linprobe, knn, lincls, compare; locatdino --help)\n"
    )


def test_ctrl_c_is_one_line_with_status_130(monkeypatch, capsys):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _fake_command(monkeypatch, KeyboardInterrupt())
    assert cli.main(["boom"]) == 130
    assert capsys.readouterr().err == "locatdino boom: interrupted\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["hbird", "--model", "m", "--k"], "locatdino hbird: argument --k: expected one argument"),
        (["hbird"], "locatdino hbird: the following arguments are required: --model"),
        (["export", "a.ckpt"], "locatdino export: the following arguments are required: out"),
        (
            ["shards", "--maxcount", "0", "src", "out"],
            "locatdino shards: argument --maxcount: must be at least 1, got 0",
        ),
        (
            ["compare", "--model", "a=vit_tiny_patch16_224", "--figure-images", "0"],
            "locatdino compare: argument --figure-images: must be at least 1, got 0",
        ),
        (["demo", "--input-size", "0"], "locatdino demo: argument --input-size: must be at least 1, got 0"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(capsys, argv, message):
    """argparse used to print the whole usage (12–23 lines) before its message."""
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err == f"{message} (locatdino {argv[0]} --help lists the options)\n"


@pytest.mark.slow
def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "locatdino", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: locatdino")


def _fake_command(monkeypatch, error: Exception) -> None:
    """Register ``locatdino boom``, a sub-command that raises ``error``."""
    module = types.ModuleType("fake_boom")

    def main(argv):
        raise error

    module.main = main
    monkeypatch.setitem(sys.modules, "fake_boom", module)
    monkeypatch.setitem(cli.COMMANDS, "boom", ("fake_boom", "raises"))


def test_errors_are_one_line_on_stderr_with_status_1(monkeypatch, capsys):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _fake_command(monkeypatch, UserError("model.backbone: unknown model 'vit_smal'"))
    assert cli.main(["boom"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "locatdino boom: model.backbone: unknown model 'vit_smal'\n" and captured.out == ""

    _fake_command(monkeypatch, KeyError("teacher"))  # not a user error: its type and how to see more
    assert cli.main(["boom"]) == 1
    assert (
        capsys.readouterr().err == f"locatdino boom: 'teacher' (KeyError; --debug or {DEBUG_ENV}=1 for the traceback)\n"
    )

    _fake_command(monkeypatch, RuntimeError("Error(s) in loading state_dict:\n\tsize mismatch\n\tmore"))
    assert cli.main(["boom"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    _fake_command(monkeypatch, UserError("bad value"))
    with pytest.raises(UserError, match="bad value"):
        cli.main(["--debug", "boom"])
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(UserError):
        cli.main(["boom"])
    monkeypatch.setenv(DEBUG_ENV, "0")
    assert cli.main(["boom"]) == 1


def test_threads_option_is_parsed_anywhere():
    assert pop_threads(["hbird", "--threads", "3", "--size", "448"]) == (["hbird", "--size", "448"], 3)
    assert pop_threads(["fit", "--threads=1"]) == (["fit"], 1)
    assert pop_threads(["fit", "--config", "x"]) == (["fit", "--config", "x"], None)
    for bad in (["fit", "--threads", "0"], ["fit", "--threads=two"], ["fit", "--threads"]):
        with pytest.raises(ValueError, match="--threads"):
            pop_threads(bad)


_PROBE = """
import sys, types
from locatdino import cli
probe = types.ModuleType("probe")
def main(argv):
    import faiss, torch, os
    print(torch.get_num_threads(), faiss.omp_get_max_threads(), os.environ["OMP_NUM_THREADS"], argv)
probe.main = main
sys.modules["probe"] = probe
cli.COMMANDS["probe"] = ("probe", "prints its thread counts")
sys.exit(cli.main(sys.argv[1:]))
"""


def _run_probe(*args: str, omp: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_threads_size_torch_faiss_and_child_processes():
    """torch, FAISS and the environment children inherit all get N; the command never sees the flag."""
    proc = _run_probe("probe", "--threads", "1", "--x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(maxsplit=3) == ["1", "1", "1", "['--x']\n"]

    cores = len(os.sched_getaffinity(0))  # default: the cores this process may use ...
    assert _run_probe("probe").stdout.split()[:3] == [str(cores)] * 3
    assert _run_probe("probe", omp="1").stdout.split()[:3] == ["1"] * 3  # ... unless OMP_NUM_THREADS says


@pytest.mark.slow
def test_bad_threads_value_is_a_usage_error():
    proc = _run_probe("probe", "--threads", "0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "locatdino: --threads must be a positive whole number of threads, not '0'\n"
    with pytest.raises(ValueError, match="not '²'"):  # a digit int() cannot read: a traceback before
        pop_threads(["fit", "--threads", "²"])


@pytest.mark.parametrize(
    "requested, omp, expected",
    [
        (None, None, (4, None)),
        (None, "2", (2, None)),
        (None, "3,1", (3, None)),
        (None, " 2 ", (2, None)),
        (3, "abc", (3, None)),
        (
            None,
            "0",
            (
                4,
                "ignoring OMP_NUM_THREADS='0' (not a positive whole number of threads): using 4, the cores this "
                "process may use (--threads N sets the number)",
            ),
        ),
        (
            None,
            "-2",
            (
                4,
                "ignoring OMP_NUM_THREADS='-2' (not a positive whole number of threads): using 4, the cores "
                "this process may use (--threads N sets the number)",
            ),
        ),
        (None, "9", (4, "OMP_NUM_THREADS='9' is more than the 4 cores this process may use: using 4")),
        (100000, None, (4, "--threads 100000 is more than the 4 cores this process may use: using 4")),
    ],
)
def test_odd_thread_counts_fall_back_with_one_line(monkeypatch, requested, omp, expected):
    from locatdino.common import threads

    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(threads, "_DROPPED", {})
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    threads.drop_invalid_thread_env()  # what import locatdino does
    assert threads.choose_threads(requested) == expected
    assert os.environ.get("OMP_NUM_THREADS") == (None if omp in ("0", "-2", "abc") else omp)  # no count: removed


@pytest.mark.slow
def test_garbage_omp_num_threads_is_one_line_not_openmps_complaint():
    """OMP_NUM_THREADS=0 made OpenMP print its own two lines at import, then ran on every core silently."""
    proc = _run_probe("probe", omp="0")
    cores = len(os.sched_getaffinity(0))
    assert proc.returncode == 0 and proc.stdout.split()[:3] == [str(cores)] * 3
    assert proc.stderr == (
        f"locatdino: ignoring OMP_NUM_THREADS='0' (not a positive whole number of threads): using "
        f"{cores}, the cores this process may use (--threads N sets the number)\n"
    )


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"locatdino {locatdino.__version__}\n"


@pytest.mark.parametrize(
    "command", ["locatdino.demo", "locatdino.evaluation.hbird.cli", "locatdino.evaluation.compare.cli"]
)
def test_help_shows_each_default_once(command):
    text = importlib.import_module(command)._parser().format_help()
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])  # one entry per option
    assert len(entries) > 5
    for entry in entries:
        assert entry.count("(default") <= 1, entry
        assert "(default: None)" not in entry and "(default: False)" not in entry, entry


def test_demo_help_keeps_real_defaults_and_the_words_for_unset_ones():
    text = " ".join(importlib.import_module("locatdino.demo")._parser().format_help().split())
    assert "--out DIR output folder: everything the command writes goes here" in text and "(default: runs/demo)" in text
    assert "training steps (default: the recipe's budget) --seed" in text


@pytest.mark.parametrize(
    "err, first, one",
    [
        (
            RuntimeError("\n  \n  size mismatch for pos_embed  \ncopying a param ..."),
            "size mismatch for pos_embed",
            f"size mismatch for pos_embed … (RuntimeError; --debug or {DEBUG_ENV}=1 for the traceback)",
        ),
        (ValueError(), "ValueError", "ValueError"),
        (UserError("bad.yaml: no key model"), "bad.yaml: no key model", "bad.yaml: no key model"),
    ],
)
def test_first_line_and_one_line(err, first, one):
    assert first_line(err) == first
    assert one_line(err) == one
