"""The ``locatdino`` command: a thin dispatcher to one module per sub-command.

Each sub-command lives next to the code it drives and exposes ``main(argv) -> int | None``;
it is imported only when used, so ``locatdino shards`` never pays for Lightning's import.
Errors escaping a sub-command are printed here, in one style for all of them
(``locatdino <command>: <message>``, exit status 1, 2 for a usage error; see
:mod:`locatdino.common.errors`): ``--debug`` anywhere on the command line (or ``LOCATDINO_DEBUG=1``)
shows the traceback instead; ``--threads N`` anywhere sizes the CPU thread pools of every command
(see :mod:`locatdino.common.threads`).
Ctrl-C ends any command with one line, ``locatdino <command>: interrupted``, exit status 130.
SIGTERM and SIGUSR1 (a scheduler's stop and warning) end every command the same way, exit status
143 / 138, after its cleanup has run (feature caches, memory banks on disk, worker processes,
output locks; :mod:`locatdino.common.processes`): Python's default would kill the process on the spot and
leave them. ``fit`` saves ``last.ckpt`` first while it trains.
"""

from __future__ import annotations

import importlib
import sys

from locatdino import __version__
from locatdino.common.arguments import GROUPS
from locatdino.common.errors import UsageError, debug_requested, one_line
from locatdino.common.processes import Terminated, raising_stop_signals, stop_status
from locatdino.common.threads import choose_threads, pop_threads, set_threads

# sub-command -> (module exposing main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("locatdino.demo", "end-to-end run on the built-in scenes (no downloads)"),
    "fit": ("locatdino.ssl.run.cli", "pretraining (DINO, iBOT, distillation or supervised) from a YAML recipe"),
    "export": ("locatdino.ssl.export.cli", "write a run's evaluated backbone (DINO: the teacher) as a timm state dict"),
    "shards": ("locatdino.data.shards.cli", "write WebDataset shards from a folder, VOC, ADE20K or scenes"),
    "hbird": ("locatdino.evaluation.hbird.cli", "Hummingbird in-context segmentation benchmark"),
    "linprobe": (
        "locatdino.evaluation.linprobe.cli",
        "the paper's dense linear probe on frozen patch tokens (segmentation mIoU)",
    ),
    "knn": (
        "locatdino.evaluation.knn.cli",
        "DINO's weighted k-NN classification of frozen class tokens (top-1, top-5)",
    ),
    "lincls": (
        "locatdino.evaluation.lincls.cli",
        "linear classification of frozen class tokens (DINO's eval_linear; not the dense linprobe)",
    ),
    "compare": ("locatdino.evaluation.compare.cli", "several models side by side: one report with figures and probes"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: locatdino [--version] [--debug] [--threads N] <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "locatdino <command> --help lists the options of a command, in the same groups for every",
        "command: model, data, protocol, output, runtime.",
        "",
        "runtime:",
        f"  {GROUPS['runtime'].split(' (')[0]}; these go anywhere on the command line",
        "",
        "  --threads N  cap the CPU threads of torch and FAISS (default: the cores this process may",
        "               use, or OMP_NUM_THREADS; never more than those cores)",
        "  --debug      show the traceback of an error instead of its one-line message (or",
        "               LOCATDINO_DEBUG=1)",
        "  --version    print the version and exit",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        argv, threads = pop_threads(argv)
    except ValueError as err:
        print(f"locatdino: {err}", file=sys.stderr)
        return 2
    if argv[:1] == ["--version"]:
        print(f"locatdino {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"locatdino: unknown command {name!r} (one of {', '.join(COMMANDS)}; locatdino --help)", file=sys.stderr)
        return 2
    threads, note = choose_threads(threads)
    if note:
        print(f"locatdino: {note}", file=sys.stderr)
    set_threads(threads)  # before the command imports FAISS
    module = importlib.import_module(COMMANDS[name][0])
    try:
        with raising_stop_signals():
            return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        if debug:
            raise
        print(f"locatdino {name}: interrupted", file=sys.stderr)
        return 130
    except Terminated as stop:
        print(f"locatdino {name}: stopped by {stop.name} (results finished before it are kept)", file=sys.stderr)
        return stop_status(stop.signum)
    except Exception as err:  # noqa: BLE001 - every command's errors end here, as one line
        if debug:
            raise
        print(f"locatdino {name}: {one_line(err)}", file=sys.stderr)
        return 2 if isinstance(err, UsageError) else 1
