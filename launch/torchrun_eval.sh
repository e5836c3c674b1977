#!/bin/bash
# An evaluation command under torchrun with a static rendezvous (docs/multinode.md), on every node
# with its own NODE_RANK; the command and its options follow the script:
#   NNODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 bash launch/torchrun_eval.sh knn --model vit_small_patch16_224:dino.pth \
#       --dataset imagefolder --data-dir data/imagenet --out runs/knn
# GPUS_PER_NODE (default 8) and MASTER_PORT (default 29500) may be set too. Each rank encodes its
# share of the images; rank 0 writes the output folder.
set -euo pipefail
torchrun --nnodes "$NNODES" --nproc_per_node "${GPUS_PER_NODE:-8}" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" \
    --no-python locatdino "$@"
