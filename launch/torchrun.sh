#!/bin/bash
# locatdino fit under torchrun with a static rendezvous, on every node (docs/multinode.md):
#   NNODES=4 NODE_RANK=<0..3> MASTER_ADDR=<node 0> bash launch/torchrun.sh --config configs/dino_small_ddp.yaml
# GPUS_PER_NODE (default 8) and MASTER_PORT (default 29500) may be set too.
# The test suite runs this file as it is, with 2 simulated nodes on one machine (tests/multinode).
set -euo pipefail
torchrun --nnodes "$NNODES" --nproc_per_node "${GPUS_PER_NODE:-8}" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" \
    --no-python locatdino fit "$@" --trainer.num_nodes "$NNODES" --trainer.devices "${GPUS_PER_NODE:-8}"
