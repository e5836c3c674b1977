"""``--help`` that shows each option's default once, and only the option groups that hold options.

argparse's ``ArgumentDefaultsHelpFormatter`` appends ``(default: …)`` to every option, also where
the help text already says what the default is (``--max-steps … (default: the recipes' budget)
(default: None)``) and for plain flags (``(default: False)``).

Every command's parser has the same option groups (:func:`locatdino.common.arguments.option_groups`);
argparse prints a group with a description even when no option of the command is in it. Both are
done through the formatter's public methods (``add_argument``, ``start_section``, ``add_text``,
``add_arguments``, ``end_section``), which argparse calls for every option and every group.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable


class EmptyGroupsHidden(argparse.HelpFormatter):
    """Leaves out a group's title and description when the group holds no option: a section's
    heading and text are held until its first option arrives, and dropped if none does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held: tuple[str | None, list[str | None]] | None = None  # heading, texts of the open section

    def start_section(self, heading: str | None) -> None:
        self.held = (heading, [])

    def add_text(self, text: str | None) -> None:
        if self.held is None:
            super().add_text(text)
        else:
            self.held[1].append(text)

    def add_arguments(self, actions: Iterable[argparse.Action]) -> None:
        actions = list(actions)
        if actions and self.held is not None:
            heading, texts = self.held
            self.held = None
            super().start_section(heading)
            for text in texts:
                super().add_text(text)
        super().add_arguments(actions)

    def end_section(self) -> None:
        if self.held is None:
            super().end_section()
        self.held = None  # a section without options was never opened


class DefaultsOnceHelpFormatter(EmptyGroupsHidden):
    """Appends ``(default: X)`` unless the help names the default itself, X is ``None`` or an
    empty list (the help says what an unset option means) or the option is a flag taking no value
    (otherwise as ``ArgumentDefaultsHelpFormatter``: options, and positionals that may be left out)."""

    def add_argument(self, action: argparse.Action) -> None:
        if shows_default(action):
            action = copy.copy(action)
            action.help = (action.help or "") + " (default: %(default)s)"
        super().add_argument(action)


def shows_default(action: argparse.Action) -> bool:
    """Whether ``--help`` appends ``action``'s default (:class:`DefaultsOnceHelpFormatter`): an
    option with help text that does not name its default, a default that is not ``None``, an empty
    list or suppressed, and a value to take."""
    help_text = action.help
    if not help_text or help_text is argparse.SUPPRESS or "(default" in help_text or action.nargs == 0:
        return False
    if action.default is None or action.default == [] or action.default is argparse.SUPPRESS:
        return False
    return bool(action.option_strings) or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
