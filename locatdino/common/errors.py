"""One error style for every ``locatdino`` command.

A :class:`UserError` is a mistake the user can fix (a wrong value, file, key or shape): the command
line prints it as one line, ``locatdino <command>: <message>``, on stderr and exits with status 1 (2
for a :class:`UsageError`, as argparse does) — no traceback. Any other exception escaping a command
is shortened the same way (its first line, and its type unless it is a ``ValueError`` or
``OSError``), unless ``--debug`` or ``LOCATDINO_DEBUG=1`` asks for the traceback.
"""

from __future__ import annotations

import os

DEBUG_ENV = "LOCATDINO_DEBUG"


class UserError(Exception):
    """Bad input, said in one line that names the file, key, shape or value at fault."""


class UsageError(UserError):
    """A command line that is not valid (an option or name that is gone, with what to write
    instead): one line, exit status 2 like argparse's own usage errors."""


def debug_requested(argv: list[str]) -> bool:
    """Whether ``argv`` holds ``--debug`` or ``LOCATDINO_DEBUG`` is set to a non-empty, non-0 value."""
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def first_line(err: BaseException) -> str:
    """The first non-empty line of ``err``'s message (its type name when it has none): library
    errors (torch, timm) often append pages of detail that a one-line report has no room for."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()
    return type(err).__name__


def one_line(err: BaseException) -> str:
    """``err`` as one line: its message's first non-empty line (the type name when it has none);
    exceptions other than :class:`UserError`, ``ValueError`` and ``OSError`` (whose messages
    already say what is wrong) get their type and the ``--debug`` hint appended."""
    text = first_line(err)
    if sum(1 for line in str(err).splitlines() if line.strip()) > 1:
        text += " …"
    if not isinstance(err, (UserError, ValueError, OSError)):
        text += f" ({type(err).__name__}; --debug or {DEBUG_ENV}=1 for the traceback)"
    return text
