"""Simulated nodes on one machine for the multi-node tests: launchers on ``PATH``, processes found
and signalled as a scheduler would, and nothing left behind.

Every process a test starts carries ``SIM_JOB=<token>`` in its environment (inherited by torchrun's
workers, srun's tasks and DataLoader workers), and each simulated node's processes also
``SIM_NODE=<k>``: :func:`job_processes` finds them through ``/proc`` even after a parent died and
its children were re-parented, so a node is frozen or killed whole (agent and workers, which
torchrun starts in sessions of their own) and :meth:`Cluster.cleanup` kills whatever is left.
``PATH`` starts with shims: ``locatdino`` and ``torchrun`` (this interpreter's, whichever venv
layout), ``srun`` (:mod:`fake_srun`) and ``scontrol`` (:mod:`fake_scontrol`).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SSL_TESTS = HERE.parent / "ssl"


def tiny_fit_flags(tmp_path: Path, max_steps: int, *extra: str) -> list[str]:
    """``locatdino fit`` flags of the multi-node runs: the tests' tiny ViT on 32 scenes in 8 shards,
    2 per batch, so 4 ranks take 4 steps per epoch, each rank reading 2 shards; no sample shuffle
    buffer (a buffer reads ahead into the next pass over the shards, so an epoch would not be
    exactly one pass); ``last.ckpt`` every 2 steps and no epoch checkpoints (one checkpoint file).
    Nothing draws from a random stream (whole-image crops, no flips, jitter or blur, no
    drop-path): RNG states are not part of a checkpoint, so only then can a resumed run end
    where an uninterrupted one does."""
    from tests.ssl.ssl_helpers import tiny_overrides

    crops = {
        "global_crop_size": 32,
        "local_crop_size": 16,
        "num_local_crops": 2,
        "global_crop_scale": [1, 1],
        "local_crop_scale": [1, 1],
        "flip_prob": 0,
        "color_jitter_prob": 0,
        "grayscale_prob": 0,
        "global_blur_prob": [0, 0],
        "global_solarize_prob": [0, 0],
        "local_blur_prob": 0,
    }
    return [
        *tiny_overrides(tmp_path),
        "--data.init_args.synthetic",
        "32",
        "--data.init_args.batch_size",
        "2",
        "--data.init_args.shuffle_buffer",
        "1",
        "--data.init_args.multicrop",
        json.dumps(crops),
        "--model.drop_path_rate",
        "0",
        "--trainer.accelerator",
        "cpu",
        "--trainer.max_steps",
        str(max_steps),
        "--epoch_checkpoint.save_top_k",
        "0",
        "--epoch_checkpoint.save_last",
        "false",
        *extra,
    ]


def sbatch_signal() -> tuple[signal.Signals, int]:
    """The early-warning signal and its lead time, as ``launch/slurm.sbatch`` asks SLURM for them."""
    found = re.search(r"^#SBATCH --signal=(\w+)@(\d+)$", (ROOT / "launch" / "slurm.sbatch").read_text(), re.M)
    return signal.Signals[f"SIG{found.group(1)}"], int(found.group(2))


def job_processes(token: str, node: int | None = None) -> list[int]:
    """Pids whose environment holds ``SIM_JOB=token`` (and ``SIM_NODE=node`` when given)."""
    wanted = {f"SIM_JOB={token}".encode()} | ({f"SIM_NODE={node}".encode()} if node is not None else set())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if wanted <= set(f.read().split(b"\0")):
                        found.append(int(entry))
            except OSError:  # gone, or not ours
                continue
    return found


def descends_from(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or a (grand)child of one."""
    while pid > 1:
        if pid in ancestors:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def task_processes(token: str, tasks_file: Path) -> list[int]:
    """Every process of the srun tasks listed in ``tasks_file`` (the ranks, their DataLoader
    workers, ...): what SLURM signals in a job, sparing the batch step (the script and srun)."""
    tasks = {int(line) for line in tasks_file.read_text().split()}
    return [pid for pid in job_processes(token) if descends_from(pid, tasks)]


def signal_processes(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def free_port(low: int = 20000, high: int = 24999) -> int:
    """A TCP port nobody listens on now, in ``[low, high]`` (SLURMEnvironment derives 15000 + the
    job id's last 4 digits, hence a range)."""
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


class Cluster:
    """Launches the processes of one test; :meth:`cleanup` (always call it) kills what is left."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp, self.token = tmp_path, uuid.uuid4().hex
        self.bin = tmp_path / "bin"
        self.bin.mkdir(exist_ok=True)
        python = sys.executable
        shims = {
            "locatdino": f'exec "{python}" -m locatdino "$@"',
            "torchrun": f'exec "{python}" -m torch.distributed.run "$@"',
            "srun": f'exec "{python}" "{HERE / "fake_srun.py"}" "$@"',
            "scontrol": f'exec "{python}" "{HERE / "fake_scontrol.py"}" "$@"',
        }
        for name, line in shims.items():
            (self.bin / name).write_text(f"#!/bin/sh\n{line}\n")
            (self.bin / name).chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "SIM_JOB": self.token,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(map(str, [ROOT, HERE, SSL_TESTS])),
            "SIM_TASKS_FILE": str(tmp_path / "tasks"),
            "SIM_SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        }
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], log: str, node: int | None = None, **env: str) -> subprocess.Popen:
        """``argv`` in a session of its own, output to ``<tmp>/<log>`` (read with :meth:`output`)."""
        extra = {**env, **({"SIM_NODE": str(node)} if node is not None else {})}
        with open(self.tmp / log, "w") as out:
            proc = subprocess.Popen(
                argv,
                env={**self.env, **extra},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.tmp,
            )
        proc.log = self.tmp / log
        self.procs.append(proc)
        return proc

    def output(self, proc: subprocess.Popen) -> str:
        return proc.log.read_text(errors="replace")

    def wait(self, proc: subprocess.Popen, timeout: float) -> int:
        """Exit status of ``proc``; past ``timeout`` s the whole job is killed and the test fails."""
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            raise AssertionError(
                f"{proc.args[:3]}... still running after {timeout} s:\n{self.output(proc)[-3000:]}"
            ) from None

    def wait_for(self, path: Path, proc_alive: list[subprocess.Popen], timeout: float) -> None:
        """Until ``path`` exists; fails (job killed) when it does not in time or a process ends first."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            ended = [p for p in proc_alive if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                self.cleanup()
                detail = self.output(ended[0])[-3000:] if ended else f"not after {timeout} s"
                raise AssertionError(f"waiting for {path.name}: {detail}")
            time.sleep(0.1)

    def node(self, k: int) -> list[int]:
        return job_processes(self.token, k)

    def cleanup(self) -> None:
        """SIGKILL every process of the job (stopped ones included), then reap the launched ones."""
        for _ in range(3):
            pids = job_processes(self.token)
            if not pids:
                break
            signal_processes(pids, signal.SIGKILL)
            time.sleep(0.2)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
