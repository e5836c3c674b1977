"""Where a benchmark or a study writes its machine-readable result, and what the file records.

Every script of ``benchmarks/`` writes its numbers as one JSON file under ``benchmarks/results/``
(or where its ``--results`` option says), rewritten as the numbers come in, so a run cut short
keeps what it measured. Each file starts with the command that made it (``python -m
benchmarks...`` with its arguments), the date and the machine (the versions, the CPU and its
vector extensions, the GPUs and the environment variables that pick kernels:
``locatdino.evaluation.provenance``), so a number in RESULTS.md leads to a file and the file to
the command that makes it again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from locatdino.evaluation.provenance import run_provenance
from locatdino.output_files import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def add_results_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--results FILE``; :func:`write_results` falls back on ``benchmarks/results/<default>``."""
    parser.add_argument("--results", type=Path, default=None, metavar="FILE",
                        help=f"where the machine-readable results go (default: benchmarks/results/{default})")


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
    written atomically: a reader never sees half a file."""
    path = path or RESULTS / default
    atomic_write_text(path, json.dumps({**header(), **numbers}, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {path}", file=sys.stderr, flush=True)
    return path
