"""Launch mistakes said at once, and stops that leave nothing behind: ranks launched with
different settings stop with one line naming the first differing key; a launch that cannot start
all its ranks (``--trainer.devices 2`` in a SLURM job without ``srun``, ``--trainer.num_nodes 2``
without a launcher) says what is missing instead of waiting out the collective timeout; SIGTERM
to ``fit`` or ``shards`` while they write the built-in scenes leaves no process behind and the run
folder free for the same command."""

import os
import signal
import time

import pytest
from cluster_sim import ROOT, Cluster, free_port, job_processes, tiny_fit_flags

from locatdino.common.output_files import output_lock

pytestmark = pytest.mark.slow


def fit_lines(cluster: Cluster, proc) -> list[str]:
    return [line for line in cluster.output(proc).splitlines() if line.startswith("locatdino fit:")]


def test_ranks_launched_with_different_settings_stop_with_one_line_naming_the_key(tmp_path):
    """Two nodes of one rank each (launch/torchrun.sh), node 1 with another --model.lr: both stop
    before the first step, each with the same line; without the check both trained to the end."""
    cluster, port = Cluster(tmp_path), str(free_port())
    try:
        nodes = [
            cluster.start(
                ["bash", str(ROOT / "launch" / "torchrun.sh"), *tiny_fit_flags(tmp_path, 4, "--model.lr", lr)],
                f"node{k}.log",
                node=k,
                NNODES="2",
                NODE_RANK=str(k),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                GPUS_PER_NODE="1",
            )
            for k, lr in enumerate(["0.002", "0.5"])
        ]
        statuses = [cluster.wait(node, 120) for node in nodes]
    finally:
        cluster.cleanup()
    expected = (
        "locatdino fit: the ranks were launched with different settings: model.init_args.lr is 0.002 on "
        "rank 0, 0.5 on rank 1; launch every rank with the same command line and config files"
    )
    for node, status in zip(nodes, statuses):
        assert status != 0 and fit_lines(cluster, node) == [expected], cluster.output(node)[-3000:]
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


SLURM_BATCH_SHELL = {
    "SLURM_JOB_ID": "4711",
    "SLURM_JOB_NAME": "locatdino-fit",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "127.0.0.1",
    "SLURM_JOB_NODELIST": "127.0.0.1",
}


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        pytest.param(
            ["--trainer.devices", "2"],
            SLURM_BATCH_SHELL,
            "--trainer.num_nodes 1 x --trainer.devices 2 = 2 ranks in SLURM job 4711, but srun did not start "
            "this process: under SLURM, srun starts the ranks, one task per device; run it under srun "
            "(launch/slurm.sbatch)",
            id="slurm-job-without-srun",
        ),
        pytest.param(
            ["--trainer.num_nodes", "2"],
            {},
            "--trainer.num_nodes 2 x --trainer.devices 1 = 2 ranks, but no launcher started this process as one "
            "of 2 nodes (no torchrun, srun or NODE_RANK): run it on every node with torchrun --nnodes 2 "
            "(launch/torchrun.sh) or under srun (launch/slurm.sbatch)",
            id="two-nodes-without-launcher",
        ),
    ],
)
def test_a_launch_that_cannot_start_its_ranks_says_what_is_missing_at_once(tmp_path, flags, env, expected):
    """Both used to wait out the collective timeout (240 s), then blame a hung rank."""
    cluster = Cluster(tmp_path)
    try:
        proc = cluster.start(["locatdino", "fit", *tiny_fit_flags(tmp_path, 4, *flags)], "fit.log", **env)
        status = cluster.wait(proc, 120)
    finally:
        cluster.cleanup()
    assert status == 1 and fit_lines(cluster, proc) == [f"locatdino fit: {expected}"], cluster.output(proc)[-3000:]


def wait_for_writers(cluster: Cluster, proc, shards_dir, timeout: float = 120) -> None:
    """Until ``proc`` writes scenes with a pool (a temporary shard folder, and 2 processes besides it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        writing = shards_dir.is_dir() and any(p.name.startswith(".tmp-shards") for p in shards_dir.iterdir())
        if writing and len(job_processes(cluster.token)) >= 3:
            return
        time.sleep(0.1)
    cluster.cleanup()
    raise AssertionError(f"no writer pool seen:\n{cluster.output(proc)[-3000:]}")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the scenes are written by one process on one core")
@pytest.mark.parametrize("command", ["fit", "shards"])
def test_sigterm_while_writing_scenes_leaves_no_process_and_no_lock(tmp_path, command):
    """The writer processes used to outlive the stopped command, re-parented to init, the run
    folder's lock with them: the same fit was then refused as "in use by another run"."""
    cluster = Cluster(tmp_path)
    shards = tmp_path / ("shards" if command == "fit" else "out")
    argv = (
        [
            "locatdino",
            "fit",
            *tiny_fit_flags(tmp_path, 4, "--data.init_args.synthetic", "3000", "--data.init_args.synthetic_size", "64"),
        ]
        if command == "fit"
        else [
            "locatdino",
            "shards",
            "--synthetic",
            "3000",
            "--size",
            "64",
            "--maxcount",
            "100",
            "--workers",
            "2",
            "--quiet",
            str(shards),
        ]
    )
    try:
        proc = cluster.start(argv, f"{command}.log")
        wait_for_writers(cluster, proc, shards)
        os.kill(proc.pid, signal.SIGTERM)
        status = cluster.wait(proc, 60)
        time.sleep(0.5)  # a killed parent's children get their parent-death signal at once; reaping is not
        left = job_processes(cluster.token)
    finally:
        cluster.cleanup()
    out = cluster.output(proc)
    assert status == 143, out[-3000:]
    assert left == []
    said = [line for line in out.splitlines() if line.startswith(f"locatdino {command}:")]
    assert said == [
        f"locatdino {command}: "
        + (
            "stopped by SIGTERM at step 0: no checkpoint saved"
            if command == "fit"
            else "stopped by SIGTERM (results finished before it are kept)"
        )
    ]
    assert not shards.exists()  # nor its temporary shard folder: the stopped first write leaves nothing
    if command == "fit":
        with output_lock(tmp_path / "run", "trainer.default_root_dir"):  # the next fit into it is not refused
            pass
