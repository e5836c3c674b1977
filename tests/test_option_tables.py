"""One CLI grammar: every command's ``--help`` in the same groups, and every protocol option mapped
to its config field through a declared table (``locatdino.common.arguments.ConfigTable``), never by name
matching: a renamed option or a new config field fails here, not silently at run time."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from locatdino.common.arguments import GROUPS, ArgumentParser, ConfigTable, option_dest
from locatdino.evaluation.compare.cli import PROBE_TABLE as COMPARE_PROBE_TABLE
from locatdino.evaluation.hbird.evaluate import HummingbirdConfig
from locatdino.evaluation.hbird.options import COMPARE_HBIRD_TABLE, HBIRD_TABLE, PROTOCOLS, parse_protocol_args
from locatdino.evaluation.knn.cli import KNN_TABLE
from locatdino.evaluation.lincls.cli import LINCLS_TABLE
from locatdino.evaluation.linprobe.cli import PROBE_TABLE

DATA = {"--dataset", "--data-dir", "--train-split", "--val-split", "--num-train", "--num-val", "--scene-size"}
LISTS = {"--train-list", "--fraction", "--fraction-seed"}  # the memory by id: hbird, linprobe, compare
MODEL = {"--model", "--pos-embed", "--checkpoint"}  # --checkpoint: retired, hidden, caught with a hint
# each command's options that set no protocol config field: models, data, device, outputs, presets
COMMANDS = {
    "locatdino.evaluation.hbird.cli": (
        [HBIRD_TABLE],
        MODEL | DATA | LISTS | {"--help", "--protocol", "--device", "--memory-dir", "--out", "--overwrite"},
    ),
    "locatdino.evaluation.linprobe.cli": (
        [PROBE_TABLE],
        MODEL | DATA | LISTS | {"--help", "--device", "--out", "--overwrite"},
    ),
    "locatdino.evaluation.knn.cli": ([KNN_TABLE], MODEL | DATA | {"--help", "--device", "--out", "--overwrite"}),
    "locatdino.evaluation.lincls.cli": ([LINCLS_TABLE], MODEL | DATA | {"--help", "--device", "--out", "--overwrite"}),
    "locatdino.evaluation.compare.cli": (
        [COMPARE_HBIRD_TABLE, COMPARE_PROBE_TABLE],
        MODEL
        | DATA
        | LISTS
        | {
            "--help",
            "--protocol",
            "--device",
            "--baselines",
            "--memory-fractions",
            "--no-linprobe",
            "--out",
            "--overwrite",
            "--figure-images",
        },
    ),
}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """``{first long option: action}`` of every optional argument of ``parser``."""
    return {next(o for o in a.option_strings if o.startswith("--")): a for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("module", COMMANDS)
def test_every_option_sets_its_field_or_is_the_command_s_own(module):
    parser = importlib.import_module(module)._parser()
    tables, own = COMMANDS[module]
    options = _options(parser)
    for table in tables:
        assert table.unaccounted() == [], f"{table.config.__name__}: fields without an option or a reason"
        for option, _field in table.options.items():
            assert option in options, f"{module}: the table names {option}, which the parser lacks"
            assert options[option].dest == option_dest(option), option
    mapped = {option for table in tables for option in table.options}
    assert set(options) - mapped == own, "an option that reaches no config field, or one named twice"
    assert not mapped & own


def test_a_table_reports_what_it_misses_and_an_option_gone_fails_loudly():
    bare = ConfigTable(HummingbirdConfig, options={"--k": "k", "--neighbours": "neighbours"}, internal={})
    missing = bare.unaccounted()
    assert "neighbours (no such field)" in missing and "beta" in missing and "k" not in missing
    parser = argparse.ArgumentParser()
    parser.add_argument("--neighbours-k", type=int, default=30)  # --k renamed, the table not
    with pytest.raises(AttributeError, match="'k'"):
        ConfigTable(HummingbirdConfig, {"--k": "k"}, {}).values(parser.parse_args([]))
    negated = ConfigTable(HummingbirdConfig, {"--no-progress": "progress"}, {}, frozenset({"--no-progress"}))
    assert negated.values(argparse.Namespace(no_progress=True)) == {"progress": False}


PARSERS = {
    "hbird": lambda: importlib.import_module("locatdino.evaluation.hbird.cli")._parser(),
    "hbird report": lambda: importlib.import_module("locatdino.evaluation.hbird.cli")._report_parser(),
    "linprobe": lambda: importlib.import_module("locatdino.evaluation.linprobe.cli")._parser(),
    "knn": lambda: importlib.import_module("locatdino.evaluation.knn.cli")._parser(),
    "lincls": lambda: importlib.import_module("locatdino.evaluation.lincls.cli")._parser(),
    "compare": lambda: importlib.import_module("locatdino.evaluation.compare.cli")._parser(),
    "demo": lambda: importlib.import_module("locatdino.demo")._parser(),
    "shards": lambda: importlib.import_module("locatdino.data.shards.cli").build_parser(),
}


@pytest.mark.parametrize("command", PARSERS)
def test_help_groups_every_option_in_the_same_order(command):
    text = PARSERS[command]().format_help()
    titles = re.findall(r"^(\w+):$", text, flags=re.M)
    assert titles[0] == "options" and titles[1:] == [t for t in GROUPS if t in titles[1:]] and len(titles) > 2
    ungrouped = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    assert ungrouped.strip().startswith("-h, --help") and ungrouped.count("\n  -") == 0, ungrouped


def test_export_help_is_grouped(capsys):
    from locatdino.ssl.export import cli as export

    with pytest.raises(SystemExit):
        export.main(["--help"])
    titles = re.findall(r"^(\w+):$", capsys.readouterr().out, flags=re.M)
    assert titles == ["options", "model", "output"]


def test_an_empty_group_is_left_out_of_the_help():
    parser = ArgumentParser(prog="x")
    parser.add_argument_group("empty", "a group without options")
    assert "empty" not in parser.format_help()


def test_protocol_reference_sets_its_settings_and_options_beside_it_win():
    from locatdino.evaluation.compare import cli as compare_cli
    from locatdino.evaluation.hbird.options import config_from_args, protocol_record

    parser = compare_cli._parser()
    args = parse_protocol_args(parser, ["--model", "m", "--protocol", "reference", "--precision", "bf16"])
    cfg = config_from_args(args)
    assert (cfg.augment, cfg.norm, cfg.eval_resolution, cfg.hungarian, cfg.index) == (
        "reference",
        True,
        "input",
        "iou",
        "Flat",
    )
    assert cfg.precision == "bf16" and compare_cli._linprobe_config(args).precision == "bf16"
    assert protocol_record(args) == {
        "name": "reference",
        "settings": {**PROTOCOLS["reference"], "precision": "bf16"},
        "changed": ["precision"],
    }
    assert (
        parse_protocol_args(compare_cli._parser(), ["--model", "m", "--protocol", "reference", "--no-norm"]).norm
        is False
    )
    default = parse_protocol_args(compare_cli._parser(), ["--model", "m"])
    assert config_from_args(default) == HummingbirdConfig()  # locatdino: the defaults, unchanged
    assert protocol_record(default) == {"name": "locatdino", "settings": PROTOCOLS["locatdino"], "changed": []}


def _documented_commands() -> list[tuple[str, list[str]]]:
    """``(page:line, argv)`` of every ``locatdino hbird|linprobe|knn|lincls|compare`` line of the shell blocks
    of README.md and docs/ (continuation lines joined, comments dropped)."""
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not re.match(r"\s*locatdino (hbird|linprobe|knn|lincls|compare) (?!report)", line):
                continue
            text, end = line, i
            while text.rstrip().endswith("\\"):  # the test's id names the command's first line
                end += 1
                text = text.rstrip()[:-1] + " " + lines[end]
            found.append((f"{page.name}:{i + 1}", shlex.split(text, comments=True)[1:]))
    return found


@pytest.mark.parametrize("where, argv", _documented_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_command_lines_use_the_current_grammar(where, argv):
    from locatdino.evaluation.model_runs import model_runs

    module = {
        "hbird": "locatdino.evaluation.hbird.cli",
        "linprobe": "locatdino.evaluation.linprobe.cli",
        "knn": "locatdino.evaluation.knn.cli",
        "lincls": "locatdino.evaluation.lincls.cli",
        "compare": "locatdino.evaluation.compare.cli",
    }[argv[0]]
    parser = importlib.import_module(module)._parser()
    assert model_runs(parser.parse_args(argv[1:]), parser)
