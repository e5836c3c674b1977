#!/bin/bash
# locatdino fit under torchrun with the c10d rendezvous: when a worker fails, every node's agent
# restarts its workers (up to MAX_RESTARTS times) and fit resumes from the run's last.ckpt
# (docs/multinode.md). The same command on every node:
#   NNODES=4 MASTER_ADDR=<a host all nodes reach> JOB_ID=dino-1 bash launch/torchrun_elastic.sh --config configs/dino_small_ddp.yaml
# GPUS_PER_NODE (default 8), MASTER_PORT (default 29500), MAX_RESTARTS (default 3) and JOIN_TIMEOUT may be
# set too. JOIN_TIMEOUT (default 60 s; torchrun's own is 600): how long a rendezvous waits for every node,
# at the first start and after a failure: a frozen node, which never rejoins, costs it on top of
# --collective_timeout; start every node within it of the first.
# The test suite runs this file as it is, with 2 simulated nodes on one machine (tests/multinode).
# Each rendezvous round gets a fresh store for the workers: torch's default shares one store across
# rounds, and after a restart a worker can read the gloo/NCCL address a dead worker left there (or
# the node that became rank 0 has no store server), which fails the restart it should make.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
set -euo pipefail
torchrun --nnodes "$NNODES" --nproc_per_node "${GPUS_PER_NODE:-8}" \
    --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv_id "$JOB_ID" \
    --rdzv_conf join_timeout="${JOIN_TIMEOUT:-60}" --max_restarts "${MAX_RESTARTS:-3}" \
    --no-python locatdino fit "$@" --trainer.num_nodes "$NNODES" --trainer.devices "${GPUS_PER_NODE:-8}"
