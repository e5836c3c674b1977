"""Stopping a run the way cluster schedulers expect: SIGTERM (and SIGUSR1 outside SLURM) saves
``last.ckpt``, exit non-zero; SLURM's early-warning signal saves ``last.ckpt`` and requeues the job.

SLURM (and most schedulers) send SIGTERM some time before killing a job, to every process of it.
Lightning's own handler is unsafe with several ranks: it runs a collective inside the signal
handler, wherever each rank happens to be, and a 2 x 2-rank job signalled this way dies of a
collective mismatch without saving (gloo: "Received data size doesn't match expected size");
its SLURM requeue handler writes the checkpoint inside the handler too (mid-step, so a
checkpoint may hold a student one update ahead of its teacher). :class:`SigtermCheckpoint`
replaces both handlers, for the training loop, by ones that only set a flag; at the end of every
training batch the ranks agree on the flags (one all-reduce of two numbers; none in a
one-process run), so all of them act at the same step:

- **SIGTERM**: save ``last.ckpt`` (``--ckpt_path last`` resumes it) and stop;
  :class:`StoppedBySignal` carries the stop up to the command, which says so in one line and
  exits with 128 + SIGTERM (143), so a wrapper script or requeue logic sees the job did not finish.
- **SIGUSR1 outside a SLURM requeue** (another scheduler's pre-emption warning, a ``kill -USR1``):
  the same as SIGTERM, exit status 138. Python's default would kill the run on the spot, losing
  the steps since the last periodic checkpoint. Outside training, both signals end ``fit`` as every
  command (:mod:`locatdino.common.processes`).
- **the requeue signal** (SIGUSR1, ``#SBATCH --signal=USR1@90``; only when Lightning's
  ``SLURMEnvironment`` with ``auto_requeue`` is the cluster environment, as it is under ``srun``):
  save ``last.ckpt``, then rank 0 runs ``scontrol requeue <job id>`` as Lightning would (a failure,
  ``scontrol`` missing included, is said in the same line; training goes on). SLURM
  then ends the job (the SIGTERM above) and starts it again, and ``fit`` resumes the saved
  ``last.ckpt`` by itself (:mod:`locatdino.ssl.run.restarts`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from locatdino.common.processes import STOP_SIGNALS


class StoppedBySignal(Exception):
    """A run stopped by a stop signal (``signum``) after saving its checkpoint; ``str()`` is one
    line naming it."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def requeue_signal(trainer: Trainer) -> signal.Signals | None:
    """The signal that asks this run to save and requeue itself: Lightning's
    ``SLURMEnvironment.requeue_signal`` when that is the run's cluster environment with
    ``auto_requeue`` on, else ``None``."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is None and SLURMEnvironment.detect():  # one task: a strategy without an environment
        environment = SLURMEnvironment()
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal
    return None


def slurm_job_id() -> str:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` in a job array, else ``SLURM_JOB_ID``."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ["SLURM_JOB_ID"]


class SigtermCheckpoint(Callback):
    """Save the run's state as ``last.ckpt`` in ``dirpath`` on a stop signal (then stop) or on
    SLURM's requeue signal (then requeue); see the module docstring. Every rank takes part in the
    save, as sharded strategies need; the checkpoint IO plugin writes it atomically. ``stopped_by``
    is the stop signal the ranks agreed on (0 until one came)."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath
        self.saved: str | None = None
        self.stopped_by = 0
        self._saved_step = -1
        self._received = {"stop": 0, "requeue": 0}

    @property
    def path(self) -> str:
        return os.path.join(self.dirpath, "last.ckpt")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Replace Lightning's handlers (registered just before the loop; it restores the ones
        before it at teardown) by flag-setting ones: the requeue signal when SLURM requeues this
        run, every other stop signal stops it."""
        requeue = requeue_signal(trainer)
        for signum in STOP_SIGNALS:
            if signum != requeue:
                signal.signal(signum, self._flag("stop"))
        if requeue is not None:
            signal.signal(requeue, self._flag("requeue"))

    def _flag(self, name: str):
        def handler(signum: int, frame: FrameType | None) -> None:
            self._received[name] = max(self._received[name], signum)

        return handler

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        stop, requeue = self._received["stop"], self._received["requeue"]
        if trainer.world_size > 1:  # one process reads its flags as they are: no tensor, no device sync
            flags = torch.tensor([stop, requeue], dtype=torch.int32, device=pl_module.device)
            stop, requeue = trainer.strategy.reduce(flags, reduce_op="max").tolist()
        if requeue:
            self._received["requeue"] = 0
            self.save(trainer)
            if trainer.is_global_zero:
                self._requeue(trainer)
        if stop:
            self.stopped_by = int(stop)
            raise SIGTERMException()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            self.save(trainer)

    def save(self, trainer: Trainer) -> None:
        """``last.ckpt`` of the current step, once per step."""
        if self._saved_step != trainer.global_step:
            trainer.save_checkpoint(self.path, weights_only=False)
            self.saved, self._saved_step = self.path, trainer.global_step

    def _requeue(self, trainer: Trainer) -> None:
        """``scontrol requeue`` (after the save): a failure, ``scontrol`` missing included, is said in
        the line and training goes on, as Lightning's handler does."""
        job = slurm_job_id()
        try:
            status = subprocess.call(["scontrol", "requeue", job])
            failure = f"status {status}" if status else None
        except OSError as err:  # no scontrol on PATH (a node without SLURM's client tools), not executable
            failure = f"scontrol: {err.strerror}"
        outcome = (
            f"requeued SLURM job {job}: it resumes from it when it starts again"
            if failure is None
            else f"`scontrol requeue {job}` failed ({failure}): the job will not start again by itself"
        )
        print(
            f"locatdino fit: requeue signal at step {trainer.global_step}: saved {self.path}; {outcome}",
            file=sys.stderr,
            flush=True,
        )
