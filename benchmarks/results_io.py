"""Where a benchmark or a study writes its machine-readable result, and what the file records.

Every script of ``benchmarks/`` writes its numbers as one JSON file under ``benchmarks/results/``
(or where its ``--results`` option says), rewritten as the numbers come in, so a run cut short keeps
what it measured. That file is checked before anything is measured (:func:`results_file`): an
existing one, such as the committed results ``benchmarks/RESULTS.md`` cites, is replaced only with
``--overwrite`` (a toy run from the repository root must not turn them into its rows), and a folder,
or a path through a file, is refused at once instead of after the measuring. Each file starts with
the command that made it (``python -m benchmarks...`` with its arguments), the date and the machine
(the versions, the CPU and its vector extensions, the GPUs and the environment variables that pick
kernels: ``locatdino.evaluation.provenance``), so a number in RESULTS.md leads to a file and the
file to the command that makes it again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from locatdino.common.output_files import atomic_write_text
from locatdino.evaluation.provenance import run_provenance

RESULTS = Path(__file__).resolve().parent / "results"


_CHECKED: set[Path] = set()  # the files results_file let this process write


def add_results_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--results FILE`` and ``--overwrite``; :func:`results_file` falls back on ``benchmarks/results/<default>``."""
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"where the machine-readable results go (default: benchmarks/results/{default})",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing results file (the committed ones RESULTS.md cites included)",
    )


def _refuse(message: str) -> SystemExit:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return SystemExit(f"{spec.name.removesuffix('.__main__') if spec else Path(sys.argv[0]).name}: {message}")


def results_file(args: argparse.Namespace, default: str) -> Path:
    """The file this run's numbers go to (``--results``, else ``benchmarks/results/<default>``),
    checked before anything is measured: a folder, a path through a file, or an existing file
    without ``--overwrite`` exits in one line."""
    path = args.results if args.results is not None else RESULTS / default
    if path.is_dir():
        raise _refuse(f"--results {path} is a folder: name the file to write, e.g. {path / Path(default).name}")
    blocking = next((p for p in path.absolute().parents if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise _refuse(f"--results {path}: {blocking} is a file, not a folder")
    if path.exists() and not args.overwrite:
        committed = " (results RESULTS.md cites are kept there)" if args.results is None else ""
        raise _refuse(
            f"{path} exists{committed}: pass --results FILE for this run's numbers, or --overwrite to replace it"
        )
    _CHECKED.add(path.absolute())
    return path


def command() -> str:
    """This process's command line as it was typed: ``python -m <module> <arguments>``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = f"python -m {spec.name.removesuffix('.__main__')}" if spec else f"python {sys.argv[0]}"
    return f"{program} {shlex.join(sys.argv[1:])}".strip()


def header() -> dict[str, Any]:
    """What every results file starts with: the command, the UTC date and the machine (versions,
    CPU, GPUs, kernel environment)."""
    machine = run_provenance()
    machine.pop("checkpoint")
    return {"command": command(), "date": machine.pop("timestamp"), "machine": machine}


def write_results(path: Path | None, default: str, numbers: dict[str, Any]) -> Path:
    """:func:`header` and ``numbers`` (JSON-able) to ``path`` (``None``: ``benchmarks/results/<default>``),
    written atomically: a reader never sees half a file. The path must have passed
    :func:`results_file` before the measuring."""
    path = path or RESULTS / default
    if path.absolute() not in _CHECKED:
        raise RuntimeError(
            f"{path} was not checked before the measuring: call results_file(args, {default!r}) "
            "after parsing the arguments"
        )
    atomic_write_text(path, json.dumps({**header(), **numbers}, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {path}", file=sys.stderr, flush=True)
    return path
