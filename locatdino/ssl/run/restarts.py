"""A job its launcher started again resumes by itself, with the command it was started with.

torchrun's elastic agent restarts every worker when one fails (``--max-restarts N``) and SLURM
starts a requeued job's script again; neither can add ``--ckpt_path last`` to the command, and
without it ``fit`` would refuse the run folder (it holds the run's own checkpoints). SLURM says
that a start is a restart with ``SLURM_RESTART_COUNT`` (0 or unset on the first start); torchrun
with ``TORCHELASTIC_RESTART_COUNT``, but only on the nodes whose agent counted a failure: an agent
that restarts its healthy workers because another node failed may do so without counting it
(which one happens first is a race). So the first start of an elastic job also records its
rendezvous id (``TORCHELASTIC_RUN_ID``, the same for every start of the job) in the run folder,
and a start that finds its own id there is a restart too. On a restart with no ``ckpt_path``
given, :func:`resume_after_restart` resumes the run folder's ``last.ckpt`` (checked as any
``--ckpt_path last``); a job that failed before its first checkpoint starts from scratch again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only

from locatdino.common.output_files import atomic_write_text
from locatdino.ssl.run.fit_checks import checkpoint_dir

RESTART_COUNTS = {"TORCHELASTIC_RESTART_COUNT": "torchrun", "SLURM_RESTART_COUNT": "SLURM"}
JOB_FILE = "elastic_job"  # in checkpoints/: the rendezvous id of the elastic job that writes them


def elastic_run_id(environ: Mapping[str, str]) -> str | None:
    """The rendezvous id of an elastic torchrun job (``--rdzv-id``), ``None`` outside one (static
    torchrun's id is ``none``)."""
    run_id = environ.get("TORCHELASTIC_RUN_ID", "")
    return run_id if run_id not in ("", "none") else None


def restart_of(environ: Mapping[str, str], root: str | None = None) -> str | None:
    """What restarted this process's job (``"restart 2 of this job by torchrun"``), or ``None`` on
    a first start; with the run folder ``root``, a start of an elastic job whose rendezvous id
    :func:`record_elastic_job` wrote there is a restart even when its counter says 0."""
    for variable, launcher in RESTART_COUNTS.items():
        count = environ.get(variable, "")
        if count.isdigit() and int(count) > 0:
            return f"restart {count} of this job by {launcher}"
    run_id = elastic_run_id(environ)
    if run_id is not None and root is not None:
        try:
            with open(os.path.join(checkpoint_dir(root), JOB_FILE), encoding="utf-8") as f:
                if f.read().strip() == run_id:
                    return f"restart of this job (rendezvous id {run_id}) by torchrun"
        except OSError:
            pass
    return None


def record_elastic_job(root: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """Write an elastic job's rendezvous id into the run folder (rank 0, when training starts), so
    that every later start of the same job knows it is a restart (:func:`restart_of`)."""
    run_id = elastic_run_id(environ)
    if run_id is not None:
        os.makedirs(checkpoint_dir(root), exist_ok=True)
        atomic_write_text(os.path.join(checkpoint_dir(root), JOB_FILE), run_id + "\n")


def resume_after_restart(config: Namespace, environ: Mapping[str, str] = os.environ) -> None:
    """Set ``config.ckpt_path`` (the merged ``fit`` config) to ``"last"`` when the job was
    restarted, none was given and the run folder holds a ``last.ckpt``; rank 0 says so in one line."""
    root = config.trainer.get("default_root_dir")
    if config.get("ckpt_path") is not None or "://" in str(root):
        return
    restart = restart_of(environ, root)
    last = os.path.join(checkpoint_dir(root), "last.ckpt")
    if restart is not None and os.path.isfile(last):
        config.ckpt_path = "last"
        if rank_zero_only.rank == 0:
            print(f"locatdino fit: {restart}: resuming {last}", file=sys.stderr, flush=True)
