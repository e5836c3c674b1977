#!/usr/bin/env bash
# The data-path benchmarks on one NVIDIA GPU as one command: input pipeline vs bare step, decode per
# core, MFU ladder (docs/gpu.md). At most ~9.5 minutes (an overall deadline of BUDGET_S seconds,
# default 560), everything under $OUT (default gpu_data_run/: each part's log and JSON, the fits'
# logs as one tarball). It installs its packages from wheels, for a CUDA machine without internet
# access:
#   bash benchmarks/gpu_check/wheels.sh     # once, on a machine with internet access; copy .whl/ over
#   bash benchmarks/gpu_check/data_run.sh   # on the CUDA machine, in the checkout that holds .whl/
# Each part has its own time limit inside one overall deadline, and writes as it goes, so a part
# cut short still leaves the others' results (and its own rows so far). DRY=1 runs every part at
# toy size on the CPU with the packages already installed (a check of this script, not a benchmark).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_data_run}
DEADLINE=$((SECONDS + ${BUDGET_S:-560}))
mkdir -p "$OUT"
left() { echo $((DEADLINE - SECONDS > $1 ? $1 : DEADLINE - SECONDS)); }
if [ -n "${DRY:-}" ]; then
    PY=${PY:-.venv/bin/python} DEVICE=cpu
    PIPELINE=(--recipes tiny --batch 4 --workers 1 --images 32 --loader-batches 2 --steps 7 --reps 2)
    MFU=(--toy --reps 2 --warmup 1) BATCHES=(2 4) BIG=4
else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "no wheels: run benchmarks/gpu_check/wheels.sh, copy .whl/ here" | tee "$OUT/machine.txt"; exit 1; }
    export PYTHONPATH=/tmp/site
    PY=python3 DEVICE=cuda PIPELINE=(--steps 40) MFU=() BATCHES=(64 256) BIG=256
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
{
    git log -1 --format='commit %H %s' 2>/dev/null; nproc; nvidia-smi --query-gpu=name,driver_version,memory.total \
        --format=csv,noheader 2>/dev/null
    $PY -c "import torch, torchvision, lightning, timm, kornia; print('torch', torch.__version__, 'cuda',
torch.version.cuda, 'torchvision', torchvision.__version__, 'lightning', lightning.__version__, 'timm',
timm.__version__, 'kornia', kornia.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/machine.txt"

echo "== decode per core"
timeout "$(left 60)" $PY -m benchmarks.speed.decode --reps 20 --results "$OUT/decode.json" 2>&1 | tee "$OUT/decode.txt"

echo "== input pipeline: bare step, loader alone, fit; CPU and GPU multi-crop paths"
timeout "$(left 300)" $PY -m benchmarks.speed.input_pipeline --device $DEVICE "${PIPELINE[@]}" --out /tmp/pipeline \
    --results "$OUT/pipeline.json" 2>&1 | grep -v -e "^Seed set" -e "available:" -e "Tip:" | tee "$OUT/pipeline.txt"
tar -czf "$OUT/fit_logs.tar.gz" -C /tmp/pipeline --exclude='*.jpg' --exclude='*.tar' --exclude='*.ckpt' . 2>/dev/null

echo "== MFU: eager and fused AdamW at batch 64 and 256, then compile and bf16 weights at 256"
timeout "$(left 120)" $PY -m benchmarks.speed.mfu --device $DEVICE "${MFU[@]}" --batch "${BATCHES[@]}" \
    --configs eager "+ fused AdamW" --results "$OUT/mfu_eager.json" 2>&1 | tee "$OUT/mfu.txt"
timeout "$(left 600)" $PY -m benchmarks.speed.mfu --device $DEVICE "${MFU[@]}" --batch $BIG \
    --models ViT-S LocAtViT-S --results "$OUT/mfu_ladder.json" 2>&1 | tee -a "$OUT/mfu.txt"
echo "finished with $((DEADLINE - SECONDS)) s of the budget left"
