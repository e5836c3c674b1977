"""One name, one meaning: every command's options walked together.

An option several commands take must have one dest, one type (its range: ``integer >= 1``), one
action, one set of choices and one help text (a command may add what the option is in it, after
`` — ``, and a note on its own default, ``(default: ...)``); the data options' help is each
command's own; no number is a bare ``int`` / ``float`` that lets ``--input-size -64`` through
to a DataLoader worker. The parsers are taken from the commands themselves (each command's
``main`` up to its ``parse_args``), so a new command is walked without being listed here.
"""

import argparse
import importlib
import re
from collections import defaultdict

import pytest

from locatdino.cli import COMMANDS
from locatdino.common.arguments import COMMAND_SENTENCE, SHARED_OPTIONS

# a command line whose first word picks another parser
SUBCOMMANDS = {"hbird": ["report"]}
# fit's options are LightningCLI's (jsonargparse), checked by its own tests
NOT_ARGPARSE = {"fit"}
# --overwrite of commands whose earlier output is not an output folder's record: export writes one
# file (never its input checkpoint); shards' earlier output is the shard set its index.json describes
OWN_MEANING = {("export", "--overwrite"), ("shards", "--overwrite"), ("linprobe", "--variant")}
# (--variant names a variant of each protocol: linprobe's DINOv2 heads, lincls's fast lr grid)
# options with one help whose choices are what each command can read (segmentation sets, class-labelled images)
OWN_CHOICES = {"--dataset"}
# options whose whole help is each command's: what its data is and what it does with it
OWN_HELP = {"--dataset", "--data-dir", "--train-split"}


class _Parsed(Exception):
    pass


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, as its ``main`` builds it."""

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    found = {}
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        for name, (module, _) in COMMANDS.items():
            if name in NOT_ARGPARSE:
                continue
            for words in ([], *([sub] for sub in SUBCOMMANDS.get(name, []))):
                with pytest.raises(_Parsed) as parsed:
                    importlib.import_module(module).main([*words, "--help"])
                found[" ".join([name, *words])] = parsed.value.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    return found


def _meaning(action: argparse.Action) -> tuple:
    help_text = re.sub(r" \(default: .*\)$", "", action.help or "").split(COMMAND_SENTENCE)[0]
    help_text = "" if set(action.option_strings) & OWN_HELP else help_text
    choices = () if set(action.option_strings) & OWN_CHOICES else tuple(action.choices or ())
    return (
        action.dest,
        getattr(action.type, "__name__", action.type),
        type(action).__name__,
        action.nargs,
        choices,
        help_text,
    )


def test_every_command_is_walked(parsers):
    assert set(parsers) >= {"demo", "export", "shards", "hbird", "hbird report", "linprobe", "knn", "lincls", "compare"}


def test_an_option_several_commands_take_means_one_thing(parsers):
    """``--batch-size`` was images per forward in hbird and compare but the training batch in
    linprobe; ``--augment``'s original-code value was ``reference`` in one and ``official`` in the
    other; ``--seed`` was a bare int in linprobe only."""
    takers = defaultdict(dict)
    for command, parser in parsers.items():
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and (command, option) not in OWN_MEANING:
                    takers[option][command] = action
    shared = {option: by for option, by in takers.items() if len(by) > 1}
    assert {
        "--seed",
        "--workers",
        "--input-size",
        "--out",
        "--overwrite",
        "--batch-size",
        "--train-batch-size",
        "--cache-dir",
        "--cache-ram-mb",
        "--lr",
        "--knn-backend",
        "--precision",
        "--prr",
    } <= set(shared)
    assert set(takers["--batch-size"]) >= {"hbird", "linprobe", "knn", "lincls", "compare"}
    differing = {
        option: {command: _meaning(action) for command, action in by.items()}
        for option, by in shared.items()
        if len({_meaning(action) for action in by.values()}) > 1
    }
    assert differing == {}
    for option, spec in SHARED_OPTIONS.items():  # one definition: the registry's
        assert all(_meaning(action)[5] == spec.help for action in takers[option].values()), option


def test_every_number_is_range_checked(parsers):
    bare = [
        f"{command} {action.option_strings or action.dest}"
        for command, parser in parsers.items()
        for action in parser._actions
        if action.type in (int, float)
        or (
            action.type is None
            and action.nargs != 0
            and isinstance(action.default, (int, float))
            and not isinstance(action.default, bool)
        )
    ]
    assert bare == []
    with pytest.raises(SystemExit):
        parsers["linprobe"].parse_args(["--model", "m", "--input-size", "-64"])


def test_the_help_says_why_the_input_size_defaults_differ(parsers):
    defaults = {
        command: parsers[command].get_default("input_size")
        for command in ("hbird", "compare", "linprobe", "knn", "lincls")
    }
    assert defaults == {"hbird": 224, "compare": 224, "linprobe": 512, "knn": 224, "lincls": 224}
    reasons = {  # each command's help gives its own default's reason, and names no other command
        "hbird": "224, the LocAtViT code's size",
        "compare": "224, the LocAtViT code's size",
        "linprobe": "512, the paper's training crop",
        "knn": "224, the reference's Resize 256 / CenterCrop 224",
        "lincls": "224, the reference's Resize 256 / CenterCrop 224",
    }
    for command, reason in reasons.items():
        (action,) = [a for a in parsers[command]._actions if "--input-size" in a.option_strings]
        assert reason in action.help and not re.search(r"\b(hbird|linprobe|knn|lincls)\b", action.help), command


@pytest.mark.parametrize(
    "command, old",
    [
        ("linprobe", "--eval-batch-size"),
        ("linprobe", "--augment"),
        ("hbird report", "--out"),
        ("lincls", "--eval-batch-size"),
        ("knn", "--k"),
    ],
)
def test_the_old_spellings_are_gone(parsers, capsys, command, old):
    """No aliases: the package has had no release."""
    assert not any(old in action.option_strings for action in parsers[command]._actions)
