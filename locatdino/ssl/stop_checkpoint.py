"""Stopping a run the way cluster schedulers expect: SIGTERM saves ``last.ckpt``, exit non-zero.

SLURM (and most schedulers) send SIGTERM some time before killing a job. Lightning turns it into
a :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException` at the end of the current
batch, on every rank; left alone that is a ``SystemExit`` with status 0 and no checkpoint of the
steps since the last periodic save. :class:`SigtermCheckpoint` writes ``last.ckpt`` at that
point (``--ckpt_path last`` resumes it), and :class:`StoppedBySignal` carries the stop up to the
command, which says so in one line and exits with 128 + SIGTERM (143), so a wrapper script
or requeue logic sees the job did not finish.
"""

from __future__ import annotations

import os
import signal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

EXIT_STATUS = 128 + signal.SIGTERM


class StoppedBySignal(Exception):
    """A run stopped by SIGTERM after saving its checkpoint; ``str()`` is one line naming it."""


class SigtermCheckpoint(Callback):
    """On a SIGTERM stop, save the run's state as ``last.ckpt`` in ``dirpath`` (every rank takes
    part, as sharded strategies need; the checkpoint IO plugin writes it atomically)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath
        self.saved: str | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, "last.ckpt")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            trainer.save_checkpoint(self.path)
            self.saved = self.path
