"""Command-line options checked where they are parsed, shown in groups, and mapped to configs.

argparse answers a bad option with the command's whole usage (12–23 lines) and a well-typed
value out of its range (``--num-train 0``, ``--input-size -64``, ``--k 0``) not at all: it fails
later, deep in a DataLoader worker or after minutes of work. :class:`ArgumentParser` says what is
wrong in one line, ``locatdino <command>: <problem> (locatdino <command> --help lists the
options)``, exit status 2; the range types turn an out-of-range value into such a line at parse
time, before any data is read or model built.

Every command's ``--help`` lists its options in the same groups (:func:`option_groups`): model,
data, protocol, output, runtime. A protocol's options reach its config dataclass through a
declared :class:`ConfigTable` (option → field), never by matching names: a renamed option then
fails loudly (``tests/test_option_tables.py`` checks every table against its parser and config).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from locatdino.common.help_format import EmptyGroupsHidden

# the groups of every command's --help, in this order: title -> what its options choose
GROUPS = {
    "model": "which backbones, with which weights",
    "data": "what is read: datasets, splits, sources",
    "protocol": "what is measured, and how",
    "output": "what is written, and where",
    "runtime": "where and how fast it runs (also --threads N and --debug, as for every command: locatdino --help)",
}


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line naming the option (exit status 2),
    and whose ``--help`` leaves out option groups that hold no option (:class:`EmptyGroupsHidden`,
    mixed into the ``formatter_class`` given)."""

    def __init__(
        self, *args: Any, formatter_class: type[argparse.HelpFormatter] = EmptyGroupsHidden, **kwargs: Any
    ) -> None:
        if not issubclass(formatter_class, EmptyGroupsHidden):
            formatter_class = type(formatter_class.__name__, (EmptyGroupsHidden, formatter_class), {})
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} ({self.prog} --help lists the options)\n")

    def refuse(self, message: str) -> NoReturn:
        """A usage error whose message already says what to write instead: one line, exit status 2."""
        self.exit(2, f"{self.prog}: {message}\n")


@dataclass(frozen=True)
class OptionGroups:
    """The argument groups of one command's parser (:data:`GROUPS`)."""

    model: Any
    data: Any
    protocol: Any
    output: Any
    runtime: Any


def option_groups(parser: argparse.ArgumentParser) -> OptionGroups:
    """Add :data:`GROUPS` to ``parser``, in their order, and return them."""
    return OptionGroups(**{title: parser.add_argument_group(title, text) for title, text in GROUPS.items()})


def option_dest(option: str) -> str:
    """argparse's attribute name of a long option: ``--no-progress`` → ``no_progress``."""
    return option.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class ConfigTable:
    """Which command-line option sets which field of a config dataclass, declared.

    ``options``: option → field; ``negated``: flags whose field is their negation
    (``--no-progress`` → ``progress``); ``internal``: field → why no option of this command sets
    it. Every field is one or the other (checked by the tests), so a field, or an option, cannot
    be dropped without a word."""

    config: type
    options: Mapping[str, str]
    internal: Mapping[str, str]
    negated: frozenset[str] = frozenset()

    def values(self, args: argparse.Namespace) -> dict[str, Any]:
        """``{field: value}`` of the parsed ``args`` for every option of the table."""
        values = {}
        for option, field in self.options.items():
            value = getattr(args, option_dest(option))  # an option gone from the parser fails here
            values[field] = (not value) if option in self.negated else value
        return values

    def build(self, args: argparse.Namespace, **fixed: Any) -> Any:
        """The config of ``args``, with the fields ``fixed`` gives (internal ones) set as given."""
        return self.config(**self.values(args), **fixed)

    def option_of(self, field: str) -> str:
        """The option that sets ``field`` (``KeyError`` when none does)."""
        for option, name in self.options.items():
            if name == field:
                return option
        raise KeyError(field)

    def unaccounted(self) -> list[str]:
        """Fields neither an option sets nor declared internal, and table entries naming no field
        (both empty for a sound table)."""
        names = {f.name for f in fields(self.config)}
        covered = set(self.options.values()) | set(self.internal)
        return sorted(names - covered) + sorted(f"{name} (no such field)" for name in covered - names)


def at_least(minimum: int) -> Callable[[str], int]:
    """argparse ``type`` of an integer ``>= minimum`` (counts, sizes, k, steps)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # what argparse names in its messages
    return parse


def integer(text: str) -> int:
    """argparse ``type`` of any integer (a block index, negative from the end)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_float(text: str) -> float:
    """argparse ``type`` of a finite number ``> 0`` (temperatures, scales)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse ``type`` of a finite number ``>= 0`` (weight decay)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


@dataclass(frozen=True)
class SharedOption:
    """An option several commands take: one type (its range included) and one help text, so that
    one name means one thing in every command; each command gives its own default."""

    type: Callable[[str], Any] | None
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


# every option more than one command takes, defined once (tests/common/test_shared_options.py walks every
# command's parser against it); a command adds one with add_shared_option
SHARED_OPTIONS: dict[str, SharedOption] = {
    "--seed": SharedOption(
        at_least(0),
        "seed of what the run draws at random (subsets, views, initialisations, "
        "batch order, the built-in scenes): the same seed, the same run",
    ),
    "--workers": SharedOption(
        at_least(0), "worker processes that read and prepare the images (0: this process does it all)"
    ),
    "--input-size": SharedOption(at_least(1), "encoder input side in px, a multiple of every model's patch size", "S"),
    "--batch-size": SharedOption(at_least(1), "images per encoder forward outside a training step"),
    "--train-batch-size": SharedOption(
        at_least(1), "training batch of a probe's head: images per optimiser step (at most the training images)"
    ),
    "--num-train": SharedOption(
        at_least(1),
        "memory (training) images: a seeded random subset of the split; for the built-in scenes, how many to render",
    ),
    "--num-val": SharedOption(
        at_least(1), "query images: a seeded random subset of the split; for the built-in scenes, how many to render"
    ),
    "--lr": SharedOption(positive_float, "learning rate of the probe's head"),
    "--cache-dir": SharedOption(
        None, "folder for features too large for RAM; without it, the system's temporary folder", "DIR"
    ),
    "--cache-ram-mb": SharedOption(
        at_least(0), "largest feature cache kept in RAM, in MB; larger ones are memory-mapped files in --cache-dir"
    ),
    "--knn-backend": SharedOption(
        None,
        "nearest-neighbour search: faiss, torch (exact, in blocks, on the encoder's device) or auto",
        choices=("auto", "faiss", "torch"),
    ),
    "--epochs": SharedOption(positive_float, "training budget in passes over the training images"),
    "--out": SharedOption(
        None,
        "output folder: everything the command writes goes here (its description lists "
        "what); one holding files the command did not write is refused",
        "DIR",
    ),
}


COMMAND_SENTENCE = " — "  # between an option's shared help and what it is in one command


def add_shared_option(
    group: Any, option: str, default: Any = None, note: str | None = None, use: str | None = None
) -> None:
    """Add the :data:`SHARED_OPTIONS` entry ``option`` to ``group`` with this command's ``default``;
    ``use``, what the option is in this command, follows the shared help after
    :data:`COMMAND_SENTENCE`; ``note``, when the default needs words (``None``: the recipes'), is
    shown as ``(default: note)``."""
    spec = SHARED_OPTIONS[option]
    group.add_argument(
        option,
        type=spec.type,
        default=default,
        metavar=spec.metavar,
        choices=spec.choices,
        help=spec.help + (f"{COMMAND_SENTENCE}{use}" if use else "") + (f" (default: {note})" if note else ""),
    )
