"""Progress bars for a terminal, plain lines for a log file.

A tqdm bar redraws itself with carriage returns, and a nested or ``leave=False`` bar moves the
cursor with escape codes; written into a file (how cluster jobs log) that is one endless line
which ``tail`` cannot show. :func:`progress` therefore gives a tqdm bar only where a person
watches (a terminal; tqdm.auto's widget in a notebook) and otherwise a :class:`LogLines` bar:
the same tqdm object and text (count, rate, time left), printed as whole lines — once at the
start, then at most every :data:`LOG_INTERVAL_S` seconds, and once at the end — with no carriage
return and no escape code. ``locatdino fit`` does the same for Lightning's training loop
(:class:`locatdino.ssl.logs.progress.LineProgressBar`).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tqdm import auto, autonotebook, std

LOG_INTERVAL_S = 30.0  # seconds between two progress lines in a log


def is_terminal(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is an open terminal (not a file, a pipe or a closed stream)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class LogLines(std.tqdm):
    """A tqdm bar whose every display is a whole line (see the module docstring): it never
    clears or moves to a line, so nothing but text and newlines reaches the file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.update(leave=False, ascii=True, dynamic_ncols=False)  # closing prints the last line
        self._last_line: float | None = None
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Print the bar's state as a line: at the start, when ``mininterval`` has passed since the
        last line (a caller may refresh at every step), and when closing (``msg == ""``)."""
        now = time.monotonic()
        if msg == "" or self._last_line is None or now - self._last_line >= self.mininterval:
            self._last_line = now
            self.fp.write(self.__str__().rstrip() + "\n")
            self.fp.flush()
        return False  # nothing to clear: tqdm then writes no carriage return

    def clear(self, nolock: bool = False) -> None:
        """Lines are never cleared."""

    def moveto(self, n: int) -> None:
        """Lines never move the cursor."""


def progress(iterable: Any = None, **kwargs: Any) -> std.tqdm:
    """``tqdm(iterable, **kwargs)`` on a terminal or in a notebook, :class:`LogLines` otherwise
    (the stream is ``kwargs["file"]``, tqdm's default ``sys.stderr``)."""
    notebook = autonotebook.tqdm is not std.tqdm  # tqdm.auto chose the notebook widget
    if kwargs.get("disable") or notebook or is_terminal(kwargs.get("file", sys.stderr)):
        return auto.tqdm(iterable, **kwargs)
    return LogLines(iterable, **kwargs)
