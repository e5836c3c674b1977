#!/bin/bash
# locatdino fit under torchrun with the c10d rendezvous: when a worker fails, every node's agent
# restarts its workers (up to MAX_RESTARTS times) and fit resumes from the run's last.ckpt
# (docs/multinode.md). The same command on every node:
#   NNODES=4 MASTER_ADDR=<a host all nodes reach> JOB_ID=dino-1 bash launch/torchrun_elastic.sh --config configs/dino_vits16.yaml
# GPUS_PER_NODE (default 8), MASTER_PORT (default 29500) and MAX_RESTARTS (default 3) may be set too.
# The test suite runs this file as it is, with 2 simulated nodes on one machine (tests/multinode).
set -euo pipefail
torchrun --nnodes "$NNODES" --nproc_per_node "${GPUS_PER_NODE:-8}" \
    --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --rdzv_id "$JOB_ID" \
    --max_restarts "${MAX_RESTARTS:-3}" \
    --no-python locatdino fit "$@" --trainer.num_nodes "$NNODES" --trainer.devices "${GPUS_PER_NODE:-8}"
