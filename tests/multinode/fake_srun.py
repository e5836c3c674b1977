"""A stand-in for SLURM's ``srun`` inside a batch job: starts ``SLURM_NNODES x
SLURM_NTASKS_PER_NODE`` tasks on this machine with the environment ``srun`` gives each task.

Usage (as the job script calls it): ``fake_srun.py [--kill-on-bad-exit=1] COMMAND ...``. Node k of
the job is the loopback address 127.0.0.(k+1) (``SLURM_JOB_NODELIST=127.0.0.[1-N]``, which
Lightning's ``SLURMEnvironment`` resolves to 127.0.0.1 for the main address, and the port from the
last digits of ``SLURM_JOB_ID``). The task pids are written, one per line, to ``$SIM_TASKS_FILE``
(the fake ``scontrol requeue`` signals them). SIGTERM, SIGINT and SIGUSR1 sent to srun itself are
forwarded to the tasks, as the real srun does. Exit status: the first non-zero task status (a
signal as 128 + its number), else 0; with ``--kill-on-bad-exit=1`` the first failing task ends the
others (SIGTERM, then SIGKILL after 10 s).
"""

import os
import signal
import subprocess
import sys
import time


def task_environment(procid: int, nodes: int, per_node: int) -> dict[str, str]:
    """What srun sets for task ``procid`` of a ``nodes x per_node`` step (the subset Lightning reads)."""
    nodelist = f"127.0.0.[1-{nodes}]" if nodes > 1 else "127.0.0.1"
    return {
        **os.environ,
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_NPROCS": str(nodes * per_node),
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node),
        "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
        "SLURMD_NODENAME": f"127.0.0.{procid // per_node + 1}",
    }


def exit_status(tasks: list[subprocess.Popen]) -> int:
    """The first failed task's status (a signal as 128 + its number), else 0."""
    failed = [t.returncode for t in tasks if t.returncode]
    return 0 if not failed else failed[0] if failed[0] > 0 else 128 - failed[0]


def main(argv: list[str]) -> int:
    kill_on_bad_exit = False
    while argv and argv[0].startswith("--"):
        kill_on_bad_exit |= argv.pop(0) in ("--kill-on-bad-exit=1", "--kill-on-bad-exit", "-K")
    nodes, per_node = int(os.environ["SLURM_NNODES"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
    tasks = [subprocess.Popen(argv, env=task_environment(i, nodes, per_node)) for i in range(nodes * per_node)]
    with open(os.environ["SIM_TASKS_FILE"], "w") as f:
        f.write("".join(f"{t.pid}\n" for t in tasks))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(signum, lambda s, _: [t.send_signal(s) for t in tasks if t.poll() is None])
    status, ending_since = 0, None
    while any(t.poll() is None for t in tasks):
        if kill_on_bad_exit and ending_since is None and exit_status(tasks):
            status, ending_since = exit_status(tasks), time.monotonic()
            for t in tasks:
                if t.poll() is None:
                    t.terminate()
        if ending_since is not None and time.monotonic() - ending_since > 10:
            for t in tasks:
                if t.poll() is None:
                    t.kill()
        time.sleep(0.1)
    return status or exit_status(tasks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
