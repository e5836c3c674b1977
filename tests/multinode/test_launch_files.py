"""The launch commands of docs/multinode.md are the files in launch/ that the multi-node tests run,
and the SLURM script asks for the signal ``fit`` answers by saving and requeueing."""

import os
import re
import signal
import subprocess

import pytest
from cluster_sim import ROOT, sbatch_signal
from lightning.fabric.plugins.environments import SLURMEnvironment

DOC = (ROOT / "docs" / "multinode.md").read_text()


def command(script: str) -> str:
    """The command a launch file runs: its lines after ``set -euo pipefail``."""
    return (ROOT / "launch" / script).read_text().split("set -euo pipefail\n", 1)[1].strip()


@pytest.mark.parametrize(
    "script", ["slurm.sbatch", "torchrun.sh", "torchrun_elastic.sh", "torchrun_eval.sh", "slurm_eval.sbatch"]
)
def test_docs_show_each_launch_command_as_the_tests_run_it(script):
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", DOC, re.S)]
    assert command(script) in blocks
    assert f"(../launch/{script})" in DOC


def test_the_sbatch_signal_is_the_one_fit_requeues_on():
    warning, lead = sbatch_signal()
    assert warning == SLURMEnvironment(auto_requeue=True).requeue_signal == signal.SIGUSR1
    assert lead == 90 and f"--signal=USR1@{lead}" in DOC
    assert re.search(r"^#SBATCH --requeue$", (ROOT / "launch" / "slurm.sbatch").read_text(), re.M)


def run_sbatch_script(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """launch/slurm.sbatch with a stand-in ``srun`` that prints its task count per node and arguments."""
    (tmp_path / "srun").write_text('#!/bin/sh\necho "$SLURM_NTASKS_PER_NODE $*"\n')
    (tmp_path / "srun").chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(ROOT / "launch" / "slurm.sbatch"), "--config", "dino_small_ddp"],
        env={**environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_job_asked_with_ntasks_gets_the_count_per_node_when_every_node_has_the_same(tmp_path):
    """``--nodes 2 --ntasks 4``: SLURM sets SLURM_TASKS_PER_NODE=2(x2) but no SLURM_NTASKS_PER_NODE
    (bash used to stop on it, unbound)."""
    done = run_sbatch_script(tmp_path, SLURM_NNODES="2", SLURM_NTASKS="4", SLURM_TASKS_PER_NODE="2(x2)")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "2 --kill-on-bad-exit=1 locatdino fit --config dino_small_ddp --trainer.num_nodes 2 --trainer.devices 2\n"
    )


@pytest.mark.parametrize("per_node", ["3,1", ""])
def test_a_job_without_one_task_count_per_node_says_what_to_ask_for(tmp_path, per_node):
    done = run_sbatch_script(tmp_path, SLURM_NNODES="2", SLURM_NTASKS="4", SLURM_TASKS_PER_NODE=per_node)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"launch/slurm.sbatch: no SLURM_NTASKS_PER_NODE, and SLURM_TASKS_PER_NODE='{per_node}' "
        "is not one count for every node: ask SLURM for --ntasks-per-node (one task per GPU), "
        "not --ntasks\n"
    )
