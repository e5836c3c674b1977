import subprocess
import sys
import types

import pytest

from locatdino import cli
from locatdino.errors import DEBUG_ENV, UserError


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"  {name}" in out


def test_unknown_command_exits_2(capsys):
    assert cli.main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err


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
    assert capsys.readouterr().err == f"locatdino boom: 'teacher' (KeyError; --debug or {DEBUG_ENV}=1 for the traceback)\n"

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
