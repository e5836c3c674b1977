"""Two simulated nodes of one process each (gloo over loopback) when one fails: frozen (SIGSTOP on
every process of the node, as a hung file system or a faulty GPU leaves it) or killed. With a
static rendezvous (``launch/torchrun.sh``) the surviving node stops with one line and a non-zero
status: at once after a kill, after ``--collective_timeout`` (5 s here) after a freeze. With the
c10d rendezvous (``launch/torchrun_elastic.sh``) a killed worker makes both nodes restart their
workers, which resume the run's ``last.ckpt`` by themselves and end at the uninterrupted run's step."""

import csv
import re
import signal

import pytest
import torch
from cluster_sim import ROOT, Cluster, free_port, signal_processes, tiny_fit_flags

pytestmark = pytest.mark.slow


def start_nodes(cluster: Cluster, script: str, flags: list[str], **env: str) -> list:
    return [
        cluster.start(
            ["bash", str(ROOT / "launch" / script), *flags],
            f"node{k}.log",
            node=k,
            NNODES="2",
            MASTER_ADDR="127.0.0.1",
            GPUS_PER_NODE="1",
            NODE_RANK=str(k),
            **env,
        )
        for k in (0, 1)
    ]


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_failed_node_stops_the_other_with_one_line(tmp_path, how):
    cluster = Cluster(tmp_path)
    flags = tiny_fit_flags(
        tmp_path,
        100,
        "--collective_timeout",
        "5",
        "--trainer.callbacks+=rank_probe.PauseAt",
        "--trainer.callbacks.marker",
        str(tmp_path / "pause"),
        "--trainer.callbacks.rank",
        "1",
        "--trainer.callbacks.step",
        "3",
    )
    try:
        nodes = start_nodes(cluster, "torchrun.sh", flags, MASTER_PORT=str(free_port()))
        cluster.wait_for(tmp_path / "pause", nodes, 120)
        failed = cluster.node(1)
        assert len(failed) == 3  # the launch script, torchrun's agent and its worker
        signal_processes(failed, signal.SIGSTOP if how == "frozen" else signal.SIGKILL)
        status = cluster.wait(nodes[0], 90)  # torch's default would wait 30 minutes for the frozen node
    finally:
        cluster.cleanup()
    out = cluster.output(nodes[0])
    assert status != 0
    said = [line for line in out.splitlines() if line.startswith("locatdino fit:")]
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    what = (
        "no answer from another rank for collective_timeout = 5 s: it hangs"
        if how == "frozen"
        else "another rank closed its connection: it died"
    )
    assert len(said) == 1 and said[0].startswith(f"locatdino fit: rank 0 stopped at step 3: {what}"), out[-3000:]
    assert said[0].endswith(f"last checkpoint: {last} (resume with --ckpt_path last)")


def test_elastic_restart_resumes_the_last_checkpoint(tmp_path):
    """Worker of node 1 killed during step 3 (last.ckpt holds step 2): both agents restart their
    workers, which resume step 2 and end at step 4 like an uninterrupted run."""
    cluster = Cluster(tmp_path)
    flags = tiny_fit_flags(
        tmp_path,
        4,
        "--trainer.callbacks+=rank_probe.PauseAt",
        "--trainer.callbacks.marker",
        str(tmp_path / "pause"),
        "--trainer.callbacks.rank",
        "1",
        "--trainer.callbacks.step",
        "3",
    )
    try:
        nodes = start_nodes(
            cluster,
            "torchrun_elastic.sh",
            flags,
            MASTER_PORT=str(free_port()),
            JOB_ID=cluster.token[:8],
            MAX_RESTARTS="1",
        )
        cluster.wait_for(tmp_path / "pause", nodes, 120)
        signal_processes([int((tmp_path / "pause").read_text())], signal.SIGKILL)
        statuses = [cluster.wait(node, 150) for node in nodes]
    finally:
        cluster.cleanup()
    outs = [cluster.output(node) for node in nodes]
    assert statuses == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    # rank 0 says it, on whichever node the new rendezvous made rank 0; its agent counted the
    # restart, or restarted its workers for the other node's failure and left its counter at 0
    said = [
        re.search(
            rf"locatdino fit: restart (1 of this job|of this job \(rendezvous id \w+\)) by torchrun: "
            rf"resuming {re.escape(str(last))}",
            out,
        )
        for out in outs
    ]
    assert sum(map(bool, said)) == 1, outs[0][-3000:] + outs[1][-3000:]
    assert torch.load(last, weights_only=True)["global_step"] == 4
    with open(tmp_path / "run" / "logs" / "version_1" / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")] == [2, 3]
