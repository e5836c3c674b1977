"""``--help`` that shows each option's default once.

argparse's ``ArgumentDefaultsHelpFormatter`` appends ``(default: …)`` to every option, also where
the help text already says what the default is (``--max-steps … (default: the recipes' budget)
(default: None)``) and for plain flags (``(default: False)``).
"""

from __future__ import annotations

import argparse


class DefaultsOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` unless the help names the default itself, X is ``None`` or an
    empty list (the help says what an unset option means) or the option is a flag taking no value."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        unset = action.default is None or action.default == []
        if "(default" in (action.help or "") or unset or action.nargs == 0:
            return action.help
        return super()._get_help_string(action)
