"""The one check of the labels that name runs: ``--model LABEL=...`` of every evaluation command
and ``hbird report --label``.

A label becomes a folder name (``OUT/<label>/``), a markdown table cell and a figure legend, so
it is refused, in one line naming it, when it

- holds a character that breaks one of those: a path separator, ``|`` (a table column), the
  characters other file systems refuse (``: * ? " < >``) or a control character (a new line);
- starts with ``.`` (``.``, ``..``, and hidden names where the output folder keeps its lock and
  record) or with or ends in a space;
- is the name of a file or folder the command itself writes into its output folder (``reserved``:
  ``results.json``, ``report.md``, ...), compared without case;
- is given twice, also when two differ in case only (one folder on a case-insensitive file system).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

from locatdino.common.output_folder import BOOKKEEPING_NAMES

FORBIDDEN = '/\\|:*?"<>'
MAX_LENGTH = 100  # far below every file system's name limit, and still a readable table column


def label_problem(label: str, reserved: Iterable[str] = ()) -> str | None:
    """Why ``label`` cannot name a run (``None`` when it can); ``reserved``: the command's own
    output names."""
    bad = sorted({c for c in label if c in FORBIDDEN or unicodedata.category(c) == "Cc"})
    if bad:
        shown = " ".join(repr(c)[1:-1] for c in bad)
        return (
            f"holds {shown}: a label names its run's folder and table row, so it may not hold / \\ | : * ? \" < > "
            "or control characters"
        )
    if not label or label.startswith(".") or label != label.strip():
        return "starts with '.' or a space, or ends in one: choose a plain name"
    if len(label) > MAX_LENGTH:
        return f"is {len(label)} characters long: at most {MAX_LENGTH}"
    if label.casefold() in {name.casefold() for name in (*reserved, *BOOKKEEPING_NAMES)}:
        return "is the name of a file the command writes into its output folder: choose another label"
    return None


def check_labels(labels: Sequence[str], option: str, reserved: Iterable[str] = ()) -> None:
    """``ValueError`` naming ``option`` and the first label that cannot name a run, or that is
    given twice (case ignored)."""
    reserved = tuple(reserved)
    seen: dict[str, str] = {}
    for label in labels:
        problem = label_problem(label, reserved)
        if problem is not None:
            raise ValueError(f"{option} label {label!r} {problem}")
        earlier = seen.get(label.casefold())
        if earlier == label:
            raise ValueError(f"{option} label {label!r} is given twice: give each run its own label")
        if earlier is not None:
            raise ValueError(
                f"{option} labels {earlier!r} and {label!r} differ in case only (one folder on a "
                "case-insensitive file system): give each run its own label"
            )
        seen[label.casefold()] = label
