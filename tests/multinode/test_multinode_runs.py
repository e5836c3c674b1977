"""Two simulated nodes of two processes each (gloo over loopback), launched as a cluster launches
them: by ``launch/torchrun.sh`` (torchrun, static rendezvous) and by ``launch/slurm.sbatch``
(a fake ``srun`` giving each task SLURM's environment, which Lightning's ``SLURMEnvironment``
reads). The torchrun run is the uninterrupted reference; the SLURM run gets the job's early-warning
signal from the sbatch file (``--signal``), saves, is requeued and stopped, and its restart
resumes by itself to the reference's weights; its checkpoint then resumes on 2 ranks."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from cluster_sim import ROOT, Cluster, free_port, sbatch_signal, signal_processes, task_processes, tiny_fit_flags

from tests.ssl.ddp_helpers import assert_same_training_state

pytestmark = pytest.mark.slow
STEPS = 8  # two epochs of 4 steps on 4 ranks
RANKS = range(4)


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    """The uninterrupted 2 x 2 run: both nodes by launch/torchrun.sh."""
    tmp = tmp_path_factory.mktemp("torchrun")
    cluster, port = Cluster(tmp), free_port()
    flags = tiny_fit_flags(
        tmp,
        STEPS,
        "--trainer.callbacks+=rank_probe.SampleLog",
        "--trainer.callbacks.out_dir",
        str(tmp / "ranks"),
        "--trainer.callbacks+=ddp_helpers.SaveRankState",
        "--trainer.callbacks.out_dir",
        str(tmp / "ranks"),
    )
    try:
        nodes = [
            cluster.start(
                ["bash", str(ROOT / "launch" / "torchrun.sh"), *flags],
                f"node{k}.log",
                node=k,
                NNODES="2",
                NODE_RANK=str(k),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                GPUS_PER_NODE="2",
            )
            for k in (0, 1)
        ]
        for node in nodes:
            assert cluster.wait(node, 240) == 0, cluster.output(node)[-3000:]
    finally:
        cluster.cleanup()
    return tmp


def test_torchrun_two_nodes_split_the_data_and_end_identical(torchrun_run):
    tmp = torchrun_run
    logs = [json.loads((tmp / "ranks" / f"samples-rank{r}.json").read_text()) for r in RANKS]
    assert [log["world_size"] for log in logs] == [4] * 4
    assert [log["batches"] for log in logs] == [STEPS] * 4
    all_samples = {tuple(s) for log in logs for s in log["samples"]}
    assert len(all_samples) == 32
    for epoch in (0, 1):  # each epoch: every scene exactly once, each rank from its own shards
        per_rank = [[tuple(s) for s in log["samples"][epoch * 8 : (epoch + 1) * 8]] for log in logs]
        assert sorted(s for samples in per_rank for s in samples) == sorted(all_samples)
        shards = [{shard for shard, _ in samples} for samples in per_rank]
        assert all(not a & b for i, a in enumerate(shards) for b in shards[i + 1 :])
    assert_same_training_state({r: torch.load(tmp / "ranks" / f"rank{r}.pt", weights_only=True) for r in RANKS})
    assert os.listdir(tmp / "run" / "checkpoints") == ["last.ckpt"]
    assert torch.load(tmp / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == STEPS


def run_sbatch(cluster: Cluster, flags: list[str], log: str, job_id: str, **env: str) -> subprocess.Popen:
    """launch/slurm.sbatch as SLURM runs a 2-node, 2-tasks-per-node batch script."""
    return cluster.start(
        ["bash", str(ROOT / "launch" / "slurm.sbatch"), *flags],
        log,
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME="locatdino-fit",
        SLURM_NNODES="2",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NTASKS_PER_NODE="2",
        **env,
    )


@dataclass
class SlurmRun:
    tmp: Path
    cluster: Cluster
    job_id: str
    first: subprocess.Popen
    first_status: int
    second: subprocess.Popen
    second_status: int


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, torchrun_run):
    """The same run under SLURM, with a DataLoader worker per rank: the early-warning signal to
    every process of the job's tasks at step 2, the requeue (the fake scontrol then SIGTERMs them
    all), and the requeued start (a copy of the stopped run is kept in ``stopped/``)."""
    tmp = tmp_path_factory.mktemp("slurm")
    cluster = Cluster(tmp)
    job_id = f"9{free_port(15000, 24999) - 15000:04d}"  # SLURMEnvironment's port: 15000 + its last 4 digits
    flags = tiny_fit_flags(
        tmp,
        STEPS,
        "--data.init_args.num_workers",
        "1",
        "--trainer.callbacks+=rank_probe.PauseAt",
        "--trainer.callbacks.marker",
        str(tmp / "pause"),
    )
    warning, _ = sbatch_signal()
    try:
        first = run_sbatch(cluster, flags, "first.log", job_id)
        cluster.wait_for(tmp / "pause", [first], 180)
        processes = task_processes(cluster.token, tmp / "tasks")
        assert len(processes) == 8  # 4 tasks and their DataLoader workers
        signal_processes(processes, warning)
        (tmp / "pause").unlink()
        first_status = cluster.wait(first, 180)
        shutil.copytree(tmp / "run", tmp / "stopped")
        second = run_sbatch(cluster, flags, "second.log", job_id, SLURM_RESTART_COUNT="1")
        second_status = cluster.wait(second, 240)
    finally:
        cluster.cleanup()
    return SlurmRun(tmp, cluster, job_id, first, first_status, second, second_status)


def test_slurm_warning_signal_saves_requeues_and_sigterm_exits_143(slurm_run):
    run = slurm_run
    out = run.cluster.output(run.first)
    assert run.first_status == 143, out[-3000:]
    assert (run.tmp / "scontrol.log").read_text() == f"requeue {run.job_id}\n"
    last = run.tmp / "run" / "checkpoints" / "last.ckpt"
    assert [line for line in out.splitlines() if line.startswith("locatdino fit:")] == [
        f"locatdino fit: requeue signal at step 3: saved {last}; requeued SLURM job {run.job_id}: it resumes from it "
        "when it starts again",
        f"locatdino fit: stopped by SIGTERM at step 4: saved {last} (resume with --ckpt_path last)",
    ]
    assert "Traceback" not in out
    assert os.listdir(run.tmp / "stopped" / "checkpoints") == ["last.ckpt"]
    assert torch.load(run.tmp / "stopped" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4


def test_requeued_slurm_job_resumes_to_the_uninterrupted_weights(slurm_run, torchrun_run):
    run = slurm_run
    out = run.cluster.output(run.second)
    assert run.second_status == 0, out[-3000:]
    assert f"locatdino fit: restart 1 of this job by SLURM: resuming {run.tmp / 'run' / 'checkpoints'}/last.ckpt" in out
    resumed = torch.load(run.tmp / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    reference = torch.load(torchrun_run / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == reference["global_step"] == STEPS
    assert resumed["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        # not bitwise: the first step after a start sums the gradients of DDP's initial buckets, the
        # uninterrupted run those of its buckets rebuilt after step 0 (1.6e-6 apart; one process resumes bitwise)
        torch.testing.assert_close(resumed["state_dict"][key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_resume_on_two_ranks_says_what_changes(slurm_run):
    """The 4-rank checkpoint of step 4 resumed on one node of 2 processes (Lightning's own launcher)."""
    tmp = slurm_run.tmp
    run = tmp / "on2"
    shutil.copytree(tmp / "stopped", run)
    flags = tiny_fit_flags(
        tmp, 6, "--trainer.default_root_dir", str(run), "--trainer.devices", "2", "--ckpt_path", "last"
    )
    cluster = Cluster(tmp)
    try:
        proc = cluster.start([sys.executable, "-m", "locatdino", "fit", *flags], "on2.log")
        status = cluster.wait(proc, 180)
    finally:
        cluster.cleanup()
    out = cluster.output(proc)
    assert status == 0, out[-3000:]
    said = [line for line in out.splitlines() if "resumed on 2 ranks" in line]
    assert len(said) == 1, out[-3000:]
    assert (
        "resumed on 2 ranks, the checkpoint was trained on 4: global batch 8 -> 4 images, so the peak lr x 0.5 "
        "(it scales with the global batch); 4 -> 8 steps per epoch, schedules rebuilt for 6 steps (were 8); the "
        "shards are split over the ranks anew, so the data order differs from an uninterrupted run"
    ) in said[0]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
