"""The launch commands of docs/multinode.md are the files in launch/ that the multi-node tests run,
and the SLURM script asks for the signal ``fit`` answers by saving and requeueing."""

import re
import signal

import pytest
from cluster_sim import ROOT, sbatch_signal
from lightning.fabric.plugins.environments import SLURMEnvironment

DOC = (ROOT / "docs" / "multinode.md").read_text()


def command(script: str) -> str:
    """The command a launch file runs: its lines after ``set -euo pipefail``."""
    return (ROOT / "launch" / script).read_text().split("set -euo pipefail\n", 1)[1].strip()


@pytest.mark.parametrize("script", ["slurm.sbatch", "torchrun.sh", "torchrun_elastic.sh"])
def test_docs_show_each_launch_command_as_the_tests_run_it(script):
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", DOC, re.S)]
    assert command(script) in blocks
    assert f"(../launch/{script})" in DOC


def test_the_sbatch_signal_is_the_one_fit_requeues_on():
    warning, lead = sbatch_signal()
    assert warning == SLURMEnvironment(auto_requeue=True).requeue_signal == signal.SIGUSR1
    assert lead == 90 and f"--signal=USR1@{lead}" in DOC
    assert re.search(r"^#SBATCH --requeue$", (ROOT / "launch" / "slurm.sbatch").read_text(), re.M)
