"""A stand-in for ``scontrol requeue JOBID``: records the call in ``$SIM_SCONTROL_LOG`` and does
what SLURM then does to the running job: SIGTERM to every process of its tasks (the pids
``fake_srun`` wrote to ``$SIM_TASKS_FILE``, with their DataLoader workers and other children;
``srun`` itself, in the batch step, is spared)."""

import os
import signal
import sys
from pathlib import Path

from cluster_sim import signal_processes, task_processes


def main(argv: list[str]) -> int:
    with open(os.environ["SIM_SCONTROL_LOG"], "a") as f:
        f.write(" ".join(argv) + "\n")
    if argv[:1] == ["requeue"]:
        signal_processes(task_processes(os.environ["SIM_JOB"], Path(os.environ["SIM_TASKS_FILE"])), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
