"""The ``--config`` files of ``locatdino fit``: checked as YAML mappings before the parser reads
them, and named in errors.

jsonargparse reports a config file that is not YAML as a raw ``ParserError`` naming no file, one
that is not a mapping (a list, a scalar, an empty file) as ``Unexpected config``, and a wrong key
or value inside one by its key alone (``model: Does not validate against any of the Union
subtypes`` for a misspelt option of the objective). :func:`read_config` refuses the first two in
one line naming the file before the parser sees them; :func:`where_set` finds the file (and the
spelling: a recipe may leave out ``init_args``) that set a key the parser refuses, unless a flag
set it, so the parser's one-line error can name it too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import yaml

from locatdino.common.errors import UserError

_MAPPING_HINT = "a config is a mapping of keys (model:, data:, trainer:, ...)"


def read_config(path: str) -> dict[str, Any]:
    """The mapping of the YAML file ``path``; :class:`UserError` naming it when it is not YAML or not a mapping."""
    try:
        with open(path) as f:
            content = yaml.safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"--config {path}: not valid YAML ({problem}{where})") from None
    if content is None:
        raise UserError(f"--config {path} is empty: {_MAPPING_HINT}")
    if not isinstance(content, dict):
        raise UserError(f"--config {path} holds a {type(content).__name__}, not a mapping: {_MAPPING_HINT}")
    return content


def config_paths(args: list[str]) -> list[str]:
    """The ``--config`` values of ``args``, in order (``--config F`` and ``--config=F``)."""
    paths = []
    for i, arg in enumerate(args):
        if arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(args):
            paths.append(args[i + 1])
    return paths


def where_set(key: str, args: Sequence[str]) -> tuple[str, str] | None:
    """``(file, key as the file spells it)`` of the last ``--config`` file of ``args`` that sets the
    dotted ``key`` (``model.init_args.lr`` is also found as ``model: {lr: ...}``); ``None`` when
    none does, or when a flag of ``args`` sets it (or a part of it: ``--model.backbone_kwargs``)."""
    if any(_sets(arg.split("=", 1)[0].removeprefix("--"), key) for arg in args if arg.startswith("--")):
        return None
    for path in reversed(config_paths(list(args))):
        if not os.path.isfile(path):
            continue
        node: Any = read_config(path)
        spelled = []
        for part in key.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
                spelled.append(part)
            elif part != "init_args":
                break
        else:
            return path, ".".join(spelled)
    return None


def _sets(flag: str, key: str) -> bool:
    """Whether the flag ``--<flag>`` sets ``key`` or a group holding it (not a whole top-level
    group: ``--model`` names the objective), with or without ``init_args``."""
    flag, key = flag.replace(".init_args", ""), key.replace(".init_args", "")
    return "." in flag and (key == flag or key.startswith(flag + "."))
