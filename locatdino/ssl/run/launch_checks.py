"""A launch that cannot reach its world size, said at once.

Lightning starts the ranks of one node itself (``--trainer.devices N`` on a machine without a
launcher), but not those of other nodes, and none when the cluster environment says someone else
starts them (SLURM: ``srun``, one task per device). Two mistakes follow the same path: ``fit
--trainer.devices 2`` run in a 2-task SLURM allocation without ``srun`` (Lightning reads the job's
2 tasks, starts nothing and waits for a rank 1 that no one will start), and ``--trainer.num_nodes 2``
without any launcher (this node's ranks wait for another node's). Either way every rank waited in
the process group's rendezvous for the whole collective timeout, then stopped blaming a hung rank.
:func:`missing_launcher` names what is missing from the Trainer's resolved environment, before
the process group is created.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch import Trainer

# what srun sets in every task it starts (a batch script's own shell has no step)
SRUN_TASK_VARIABLE = "SLURM_STEP_ID"
# what a user launching every node by hand sets for Lightning (its LightningEnvironment reads them)
NODE_RANK_VARIABLES = ("NODE_RANK", "GROUP_RANK")


def missing_launcher(trainer: Trainer, environ: Mapping[str, str]) -> str | None:
    """One line saying what a launch of ``trainer`` lacks to start all its ranks, or ``None``."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    nodes, devices = trainer.num_nodes, trainer.num_devices
    ranks = f"--trainer.num_nodes {nodes} x --trainer.devices {devices} = {nodes * devices} ranks"
    if nodes * devices <= 1:
        return None
    if isinstance(environment, SLURMEnvironment) and SRUN_TASK_VARIABLE not in environ:
        return (
            f"{ranks} in SLURM job {environ.get('SLURM_JOB_ID', '?')}, but srun did not start this process: "
            "under SLURM, srun starts the ranks, one task per device; run it under srun (launch/slurm.sbatch)"
        )
    if (
        isinstance(environment, LightningEnvironment)
        and nodes > 1
        and not any(v in environ for v in NODE_RANK_VARIABLES)
    ):
        return (
            f"{ranks}, but no launcher started this process as one of {nodes} nodes (no torchrun, srun or "
            f"NODE_RANK): run it on every node with torchrun --nnodes {nodes} (launch/torchrun.sh) or under "
            "srun (launch/slurm.sbatch)"
        )
    return None
