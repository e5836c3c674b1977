"""How long a multi-node job takes to stop when a node fails, and the legitimate waits the
collective timeout must stay above (benchmarks/RESULTS.md, "How long does a multi-node job wait for a failed node?";
docs/multinode.md).

``stop``: two simulated nodes of one process each on this machine (``launch/torchrun.sh``, gloo over
loopback; the test suite's ``tests/multinode/cluster_sim.py``), the tests' tiny run; at step 3 every
process of node 1 (the launch script, torchrun's agent, its worker) is frozen (SIGSTOP) or killed,
and the time until node 0's torchrun exits is measured::

    python -m benchmarks.speed.multinode stop --how frozen            # the default collective_timeout
    python -m benchmarks.speed.multinode stop --how frozen --collective-timeout 1800   # torch's default
    python -m benchmarks.speed.multinode stop --how frozen --launch elastic            # launch/torchrun_elastic.sh
    JOIN_TIMEOUT=600 python -m benchmarks.speed.multinode stop --how frozen --launch elastic   # torchrun's default

``waits``: what one rank may legitimately wait for another, measured here: writing the DINO ViT-S/16
checkpoint (``configs/dino_small_ddp.yaml``'s model, AdamW moments included; rank 0 writes, the others
wait at the barrier after it) and the online Hummingbird monitor at its defaults (ViT-S/16,
224 px, 32 memory / 8 query scenes); the ViT-L/16 checkpoint's size is counted on the meta
device. Results are appended to ``--out`` (JSON: ``results``, one object per measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stop_time(how: str, collective_timeout: float | None, limit: float, launch: str) -> dict:
    """Seconds from node 1's failure to node 0's exit, its status and its first ``locatdino fit:`` line."""
    from tests.multinode.cluster_sim import Cluster, free_port, signal_processes, tiny_fit_flags

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        cluster = Cluster(tmp_path)
        extra = [] if collective_timeout is None else ["--collective_timeout", str(collective_timeout)]
        flags = tiny_fit_flags(
            tmp_path,
            10_000,
            *extra,
            "--trainer.callbacks+=rank_probe.PauseAt",
            "--trainer.callbacks.marker",
            str(tmp_path / "pause"),
            "--trainer.callbacks.rank",
            "1",
            "--trainer.callbacks.step",
            "3",
        )
        port = free_port()
        try:
            script = "torchrun.sh" if launch == "static" else "torchrun_elastic.sh"
            nodes = [
                cluster.start(
                    ["bash", str(ROOT / "launch" / script), *flags],
                    f"node{k}.log",
                    node=k,
                    NNODES="2",
                    NODE_RANK=str(k),
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    GPUS_PER_NODE="1",
                    JOB_ID=cluster.token[:8],
                )
                for k in (0, 1)
            ]
            cluster.wait_for(tmp_path / "pause", nodes, 300)
            signal_processes(cluster.node(1), signal.SIGSTOP if how == "frozen" else signal.SIGKILL)
            start = time.monotonic()
            status = cluster.wait(nodes[0], limit)
            seconds = time.monotonic() - start
        finally:
            cluster.cleanup()
        said = [line for line in cluster.output(nodes[0]).splitlines() if line.startswith("locatdino fit:")]
    join_timeout = int(os.environ.get("JOIN_TIMEOUT", 60)) if launch == "elastic" else None  # the script's default
    return {
        "measure": "stop",
        "launch": launch,
        "how": how,
        "collective_timeout_s": collective_timeout,
        "join_timeout_s": join_timeout,
        "stop_s": round(seconds, 1),
        "exit_status": status,
        "line": said[0] if said else None,
    }


def checkpoint_write(folder: str) -> list[dict]:
    """Write time and size of the ViT-S/16 DINO checkpoint (weights and AdamW moments), and the
    ViT-L/16 one's size."""
    import torch

    from locatdino.ssl import DINOModule, atomic_torch_save

    def checkpoint(module: DINOModule) -> dict:
        params = [p for p in module.student.parameters() if p.requires_grad]
        moments = {i: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)} for i, p in enumerate(params)}
        return {"state_dict": module.state_dict(), "optimizer_states": [{"state": moments}]}

    def size(state: dict) -> int:
        tensors = [
            *state["state_dict"].values(),
            *(t for m in state["optimizer_states"][0]["state"].values() for t in m.values()),
        ]
        return sum(t.numel() * t.element_size() for t in tensors)

    out = []
    state = checkpoint(DINOModule(backbone="vit_small_patch16_224", norm_last_layer=False))
    path = os.path.join(folder, "last.ckpt")
    times = []
    for _ in range(3):
        start = time.monotonic()
        atomic_torch_save(state, path)  # temporary file, fsync, rename: what AtomicCheckpointIO does
        times.append(time.monotonic() - start)
    out.append(
        {
            "measure": "checkpoint write",
            "model": "DINO ViT-S/16 (dino_small_ddp)",
            "gb": round(size(state) / 1e9, 2),
            "seconds": round(min(times), 2),
            "folder": folder,
        }
    )
    with torch.device("meta"):
        large = checkpoint(DINOModule(backbone="vit_large_patch16_224"))
    out.append(
        {"measure": "checkpoint size", "model": "DINO ViT-L/16 (dino_large_fsdp)", "gb": round(size(large) / 1e9, 2)}
    )
    return out


def hummingbird_monitor() -> list[dict]:
    """The monitor's defaults on a ViT-S/16: its first call (scenes rendered and decoded) and a later one."""
    import timm
    import torch

    from locatdino.evaluation.hbird import HummingbirdMonitor

    backbone = timm.create_model("vit_small_patch16_224", num_classes=0).eval()
    monitor = HummingbirdMonitor()
    out = []
    for call in ("first", "later"):
        start = time.monotonic()
        with torch.no_grad():
            monitor.evaluate(backbone)
        out.append(
            {
                "measure": "hummingbird monitor",
                "call": call,
                "threads": torch.get_num_threads(),
                "seconds": round(time.monotonic() - start, 1),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    stop = sub.add_parser("stop")
    stop.add_argument("--how", choices=["frozen", "killed"], required=True)
    stop.add_argument("--collective-timeout", type=float, default=None, help="default: fit's default")
    stop.add_argument(
        "--launch",
        choices=["static", "elastic"],
        default="static",
        help="launch/torchrun.sh or launch/torchrun_elastic.sh (its default MAX_RESTARTS)",
    )
    stop.add_argument("--limit", type=float, default=3600, help="give up (and fail) after this many seconds")
    waits = sub.add_parser("waits")
    waits.add_argument("--folder", default=str(ROOT / "runs"), help="where the checkpoint is written")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "multinode_stop.json"))
    args = parser.parse_args()
    if args.what == "stop":
        results = [stop_time(args.how, args.collective_timeout, args.limit, args.launch)]
    else:
        os.makedirs(args.folder, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=args.folder) as folder:
            results = [*checkpoint_write(folder), *hummingbird_monitor()]
    for result in results:
        print(json.dumps(result))
    path = Path(args.out)
    kept = json.loads(path.read_text()) if path.exists() else {"results": []}
    kept["results"] += results
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
