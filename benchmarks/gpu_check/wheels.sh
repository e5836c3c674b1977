#!/usr/bin/env bash
# The Python packages that the GPU scripts (benchmarks/gpu_check/run.sh, data_run.sh and the GPU
# study) need and that a CUDA machine's preinstalled Python often lacks, for a machine without
# internet access. Such an image typically has torch + CUDA, Lightning, numpy, scipy and Pillow but
# not these; timm perhaps, in a version not known to be >= 1.0.20, which LocAtViT needs. As wheels
# for CPython 3.12 / x86-64, into the repository's .whl/ (git-ignored, ~30 MB): run it once on a
# machine with internet access, then copy .whl/ into the checkout on the CUDA machine. Pinned to
# the versions the CPU test suite runs with.
set -euo pipefail
cd "$(dirname "$0")/../.."
"${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    faiss-cpu==1.15.1 kornia==0.9.0 kornia-rs==0.2.0 webdataset==1.0.2 braceexpand==0.1.7 \
    jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 timm==1.0.31
ls -l .whl
