#!/usr/bin/env bash
# The GPU check as one command, for a machine with a CUDA GPU whose Python already has torch, timm,
# Lightning and numpy but which cannot reach a package registry (a cluster node without internet
# access, say, or a container image with torch 2.11 and CUDA). With internet access, install the
# package instead and run `python -m benchmarks.gpu_check` directly (docs/gpu.md). Two steps:
#
#   bash benchmarks/gpu_check/run.sh wheels   # with internet access: the missing packages' wheels into .whl/
#   bash benchmarks/gpu_check/run.sh run      # on the CUDA machine, .whl/ copied over: install, check, tarball
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check/run.sh run --dry-run   # the same steps on a CPU (a smoke test)
#
# `wheels` runs benchmarks/gpu_check/wheels.sh: for CPython 3.12 on manylinux x86-64 and without
# dependencies, the packages such a machine usually lacks (faiss-cpu, kornia, webdataset,
# jsonargparse[signatures], a timm that has LocAtViT's parts), at the tested versions. .whl/ is
# git-ignored (about 30 MB).
# `run` installs them into /tmp/site (--target: the machine's own packages stay as they are), runs
# `python -m benchmarks.gpu_check` with a deadline of GPU_CHECK_DEADLINE seconds (default 440) under
# a hard `timeout` of 480 s, and packs --out into $OUT/gpu_check.tgz ($OUT defaults to gpu_run_out/;
# table.md and results.json lie beside the tarball, readable without unpacking): a few small files
# to copy off the machine. Exit status: gpu_check's (0 all pass, 1 a check failed, 2 a target
# missed, 3 cases hit the deadline), 124 if the hard timeout struck. Arguments after `run` go to the
# check (e.g. --only kernels speed).
set -uo pipefail
cd "$(dirname "$0")/../.."

case "${1:-}" in
wheels)
    bash benchmarks/gpu_check/wheels.sh  # one set of wheels for every GPU script of benchmarks/
    ;;
run)
    export PYTHONUNBUFFERED=1 OUT="${OUT:-gpu_run_out}"
    mkdir -p "$OUT"
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_run: installing .whl/*.whl failed (fetch them with 'run.sh wheels', copy .whl/ here)"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    "${PYTHON:-python3}" -c "import faiss, webdataset, jsonargparse, lightning, timm, torch; import locatdino.cli, locatdino.ssl.run.cli;
print('gpu_run: torch', torch.__version__, 'CUDA', torch.cuda.is_available(), 'timm', timm.__version__,
      'lightning', lightning.__version__, 'faiss', faiss.__version__)" || exit 1
    results=/tmp/gpu_check_out
    rm -rf "$results"
    timeout -k 10 480 "${PYTHON:-python3}" -m benchmarks.gpu_check --out "$results" \
        --deadline "${GPU_CHECK_DEADLINE:-440}" "${@:2}" 2>&1 | tee "$OUT/gpu_check.log"
    status=${PIPESTATUS[0]}
    cp "$results/table.md" "$results/results.json" "$OUT/" 2>/dev/null
    tar -czf "$OUT/gpu_check.tgz" --exclude='*.ckpt' -C "$(dirname "$results")" "$(basename "$results")"
    ls -l "$OUT"
    echo "gpu_run: gpu_check exit status $status"
    exit "$status"
    ;;
*)
    echo "usage: bash benchmarks/gpu_check/run.sh wheels|run" >&2
    exit 2
    ;;
esac
