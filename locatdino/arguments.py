"""Command-line options checked where they are parsed: one-line parser errors and range types.

argparse answers a bad option with the command's whole usage (12–23 lines) and a well-typed
value out of its range (``--num-train 0``, ``--input-size -64``, ``--k 0``) not at all: it fails
later, deep in a DataLoader worker or after minutes of work. :class:`ArgumentParser` says what is
wrong in one line, ``locatdino <command>: <problem> (locatdino <command> --help lists the
options)``, exit status 2; the range types turn an out-of-range value into such a line at parse
time, before any data is read or model built.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line naming the option (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} ({self.prog} --help lists the options)\n")


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
