"""What a test can leave behind in the pytest process, and the autouse fixture that undoes it.

Why: the suite runs ~1,500 tests in one process. A test that changes process-wide state and
leaves it changed alters every test after it, so a test's result depended on which tests ran
before it: an in-process ``fit`` wrote ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` into
``os.environ``, and a later test's child process then ran with other thread settings than the
parent it compared with. The fixture captures the state before each test and restores it after.

A change a test did not undo fails that test, naming what changed, with two exceptions. The
state the command line owns (the thread variables and torch's thread count that ``locatdino``
sets before a command runs, and Lightning's seed variables that ``fit``'s ``seed_everything``
writes) is undone silently when the test ran that command in this process — that is what a
command does, not a defect of the test — and so are the variables a library writes for itself
while it is used (torch.compile's kernel loader, wandb's service).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import pytest
import torch

from locatdino.common.threads import THREAD_ENV_VARS

# what running a command in this process sets on purpose (see the module docstring)
COMMAND_ENV = frozenset(THREAD_ENV_VARS) | {"PL_GLOBAL_SEED", "PL_SEED_WORKERS"}
LOGGER_PREFIX = "locatdino"
PYTEST_ENV = "PYTEST_CURRENT_TEST"  # pytest's own, rewritten at every phase of every test
# what libraries write for themselves while a test uses them: restored, never a defect of the test
LIBRARY_ENV = frozenset(
    {
        "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",  # torch.compile, whenever it loads a compiled kernel
        "WANDB_SERVICE",  # the wandb service process that a wandb run of this process started
        "KMP_DUPLICATE_LIB_OK",  # scikit-learn, when it is first imported (its OpenMP runtime guard)
        "KMP_INIT_AT_FORK",  # scikit-learn, likewise
    }
)


def _package_loggers() -> dict[str, logging.Logger]:
    """The root logger and this package's loggers: the ones whose handlers a command may install."""
    loggers = {"root": logging.getLogger()}
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (name == LOGGER_PREFIX or name.startswith(LOGGER_PREFIX + ".")):
            loggers[name] = logger
    return loggers


def _own_handlers(logger: logging.Logger) -> tuple[logging.Handler, ...]:
    """The logger's handlers less pytest's capture handlers (pytest swaps those per test phase)."""
    return tuple(h for h in logger.handlers if not type(h).__module__.startswith("_pytest"))


@dataclass(frozen=True)
class ProcessState:
    """A snapshot of the process-wide settings a test can change."""

    environ: dict[str, str]
    threads: int
    matmul_precision: str
    default_dtype: torch.dtype
    grad_enabled: bool
    deterministic: tuple[bool, bool]  # (enabled, warn only)
    loggers: dict[str, tuple[int, tuple[logging.Handler, ...]]]  # name -> (level, handlers)

    @classmethod
    def capture(cls) -> ProcessState:
        return cls(
            environ={k: v for k, v in os.environ.items() if k != PYTEST_ENV},
            threads=torch.get_num_threads(),
            matmul_precision=torch.get_float32_matmul_precision(),
            default_dtype=torch.get_default_dtype(),
            grad_enabled=torch.is_grad_enabled(),
            deterministic=(
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            loggers={name: (lg.level, _own_handlers(lg)) for name, lg in _package_loggers().items()},
        )

    def changes(self, after: ProcessState) -> list[tuple[str, str]]:
        """``(what, before -> after)`` for every setting that differs in ``after``; ``what`` starts
        with ``os.environ`` or ``torch threads`` for the state the command line owns."""
        found = []
        for key in sorted(self.environ.keys() | after.environ.keys()):
            old, new = self.environ.get(key), after.environ.get(key)
            if old != new:
                found.append((f"os.environ[{key!r}]", f"{old!r} -> {new!r}"))
        for what, old, new in (
            ("torch threads", self.threads, after.threads),
            ("float32 matmul precision", self.matmul_precision, after.matmul_precision),
            ("default dtype", self.default_dtype, after.default_dtype),
            ("grad mode", self.grad_enabled, after.grad_enabled),
            ("deterministic algorithms (enabled, warn only)", self.deterministic, after.deterministic),
        ):
            if old != new:
                found.append((what, f"{old!r} -> {new!r}"))
        for name in sorted(self.loggers.keys() | after.loggers.keys()):
            old, new = self.loggers.get(name, (logging.NOTSET, ())), after.loggers.get(name, (logging.NOTSET, ()))
            if old != new:
                found.append((f"logger {name!r} (level, handlers)", f"{old!r} -> {new!r}"))
        return found

    def restore(self) -> None:
        current = os.environ.get(PYTEST_ENV)
        os.environ.clear()
        os.environ.update(self.environ)
        if current is not None:
            os.environ[PYTEST_ENV] = current
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.set_default_dtype(self.default_dtype)
        torch.set_grad_enabled(self.grad_enabled)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        for name, logger in _package_loggers().items():
            level, handlers = self.loggers.get(name, (logging.NOTSET, ()))
            logger.setLevel(level)
            logger.handlers[:] = [*handlers, *(h for h in logger.handlers if h not in _own_handlers(logger))]


def owned_by_command(what: str) -> bool:
    """Whether a change is one that running a command in this process makes on purpose."""
    return what == "torch threads" or any(what == f"os.environ[{key!r}]" for key in COMMAND_ENV)


def owned_by_library(what: str) -> bool:
    """Whether a change is one a library makes for itself while it is used (see ``LIBRARY_ENV``)."""
    return any(what == f"os.environ[{key!r}]" for key in LIBRARY_ENV)


class CommandRuns:
    """Counts the commands a test runs in this process, by wrapping the two places that set the
    command-owned state: the dispatcher's ``set_threads`` and LightningCLI's ``seed_everything``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import lightning.pytorch.cli as lightning_cli

        import locatdino.cli as dispatcher

        self.count = 0
        for module, name in ((dispatcher, "set_threads"), (lightning_cli, "seed_everything")):
            monkeypatch.setattr(module, name, self._counting(getattr(module, name)))

    def _counting(self, fn):
        def wrapper(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)

        return wrapper


@pytest.fixture(autouse=True, scope="module")
def restore_module_state():
    """Restore, after a test file, what its module-scoped fixtures changed (a run they share)."""
    before = ProcessState.capture()
    yield
    before.restore()


@pytest.fixture(autouse=True)
def restore_process_state(request: pytest.FixtureRequest):
    """Restore what the test changed; fail it for a change it should have undone itself."""
    before = ProcessState.capture()
    with pytest.MonkeyPatch.context() as patches:
        commands = CommandRuns(patches)
        yield
    changed = before.changes(ProcessState.capture())
    before.restore()
    leaked = [
        f"{what}: {diff}"
        for what, diff in changed
        if not owned_by_library(what) and not (commands.count and owned_by_command(what))
    ]
    if leaked:
        pytest.fail(f"{request.node.nodeid} left process state changed: {'; '.join(leaked)}", pytrace=False)
