"""A job its launcher started again resumes by itself, with the command it was started with.

torchrun's elastic agent restarts every worker when one fails (``--max-restarts N``) and SLURM
starts a requeued job's script again; neither can add ``--ckpt_path last`` to the command, and
without it ``fit`` would refuse the run folder (it holds the run's own checkpoints). Both say
that this start is a restart: torchrun sets ``TORCHELASTIC_RESTART_COUNT`` and SLURM
``SLURM_RESTART_COUNT`` (0 or unset on the first start). When either is above 0 and no
``ckpt_path`` is given, :func:`resume_after_restart` resumes the run folder's ``last.ckpt``
(checked as any ``--ckpt_path last``); a job that failed before its first checkpoint starts
from scratch again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

from locatdino.ssl.fit_checks import checkpoint_dir

RESTART_COUNTS = {"TORCHELASTIC_RESTART_COUNT": "torchrun", "SLURM_RESTART_COUNT": "SLURM"}


def restart_of(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """``(launcher, restarts so far)`` when this process belongs to a restarted job, else ``None``."""
    for variable, launcher in RESTART_COUNTS.items():
        count = environ.get(variable, "")
        if count.isdigit() and int(count) > 0:
            return launcher, int(count)
    return None


def resume_after_restart(config: Namespace, environ: Mapping[str, str] = os.environ) -> None:
    """Set ``config.ckpt_path`` (the merged ``fit`` config) to ``"last"`` when the job was
    restarted, none was given and the run folder holds a ``last.ckpt``; rank 0 says so in one line."""
    restart = restart_of(environ)
    root = config.trainer.get("default_root_dir")
    if restart is None or config.get("ckpt_path") is not None or "://" in str(root):
        return
    last = os.path.join(checkpoint_dir(root), "last.ckpt")
    if os.path.isfile(last):
        config.ckpt_path = "last"
        if rank_zero_only.rank == 0:
            launcher, count = restart
            print(f"locatdino fit: restart {count} of this job by {launcher}: resuming {last}", file=sys.stderr, flush=True)
