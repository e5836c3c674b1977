"""The suite's guard against tests that leave process-wide state behind (tests/process_state.py)."""

import os
import re
from pathlib import Path

import pytest
import torch

from tests.process_state import ProcessState, owned_by_command, owned_by_library

LEAKY = """
import os

def test_leaks_threads():
    os.environ["OMP_NUM_THREADS"] = "7"

def test_sees_the_environment_as_before():
    assert os.environ.get("OMP_NUM_THREADS") == {before!r}

def test_cleans_up(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
"""


@pytest.mark.slow
def test_a_test_that_leaves_omp_num_threads_set_fails_by_name_and_the_next_one_sees_it_restored(pytester, monkeypatch):
    root = str(Path(__file__).parents[1])  # the child imports tests.process_state from this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    pytester.makeconftest("from tests.process_state import restore_module_state, restore_process_state\n")
    pytester.makepyfile(test_leaky=LEAKY.format(before=os.environ.get("OMP_NUM_THREADS")))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)  # the leaking test passes, then errors in its teardown
    leak = "test_leaky.py::test_leaks_threads left process state changed: os.environ['OMP_NUM_THREADS']: "
    result.stdout.re_match_lines([".*" + re.escape(f"{leak}{os.environ.get('OMP_NUM_THREADS')!r} -> '7'") + "$"])


def test_every_captured_setting_is_reported_and_restored():
    before = ProcessState.capture()
    try:
        os.environ["LOCATDINO_PROCESS_STATE_PROBE"] = "1"
        torch.set_float32_matmul_precision("medium" if before.matmul_precision != "medium" else "high")
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        changed = [what for what, _ in before.changes(ProcessState.capture())]
    finally:
        before.restore()
    assert changed == [
        "os.environ['LOCATDINO_PROCESS_STATE_PROBE']",
        "float32 matmul precision",
        "default dtype",
        "grad mode",
    ]
    assert before.changes(ProcessState.capture()) == []


def test_only_the_command_line_state_is_excused_after_a_command():
    assert owned_by_command("os.environ['OMP_NUM_THREADS']") and owned_by_command("torch threads")
    assert owned_by_command("os.environ['PL_GLOBAL_SEED']")
    assert not owned_by_command("os.environ['HOME']") and not owned_by_command("default dtype")


def test_what_a_library_writes_for_itself_is_excused_and_nothing_else():
    assert owned_by_library("os.environ['WANDB_SERVICE']")
    assert not owned_by_library("os.environ['OMP_NUM_THREADS']") and not owned_by_library("torch threads")
