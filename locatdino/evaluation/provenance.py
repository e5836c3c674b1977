"""Where an evaluation result was measured: software, machine, checkpoint and time.

Two ``results.json`` can only be compared honestly when it is known what produced each: a library
upgrade changes kernels, another CPU changes speed by integer factors (bf16 is fast only with
AVX512-BF16 or AMX; torch, oneDNN, MKL and FAISS pick AVX-512 or AVX2 code paths at run time, and
environment variables such as ``ATEN_CPU_CAPABILITY`` or ``FAISS_SIMD_LEVEL`` force them lower), and
a checkpoint file can be replaced under the same name. So every run records the versions, the CPU
model and its vector extensions as the libraries see them, the GPUs, the environment variables that
change kernels, a UTC timestamp and the SHA-256 of the checkpoint file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

# Distributions whose versions change the numbers or the timings.
_PACKAGES = ("torch", "torchvision", "timm", "numpy", "scipy", "pillow")
# Environment variables that select kernels or thread counts.
_KERNEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "MKL_ENABLE_INSTRUCTIONS",
    "FAISS_OPT_LEVEL",
    "FAISS_SIMD_LEVEL",
    "OPENBLAS_CORETYPE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
# /proc/cpuinfo flags that decide the fast paths: AVX-512, its bf16 dot products, Intel AMX.
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks (checkpoints can be GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_record(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """``{path, bytes, sha256}`` of a checkpoint file (of a Hugging Face model folder: of its weights
    file, named in ``file``); None for random init."""
    if path is None:
        return None
    from locatdino.models.checkpoints.hugging_face import weights_in_folder  # torch, timm: loaded when needed

    path = Path(path)
    weights = Path(weights_in_folder(str(path))) if path.is_dir() else path
    record = {"path": str(path), "bytes": weights.stat().st_size, "sha256": file_sha256(weights)}
    return record if weights == path else {**record, "file": str(weights)}


def cpu_model_and_flags() -> tuple[str | None, set[str] | None]:
    """CPU model name and flags from ``/proc/cpuinfo`` (Linux); ``(None, None)`` elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, None
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    return model, flags


def cpu_info() -> dict[str, Any]:
    """CPU model, cores, torch threads and vector extensions (what the CPU has, and what torch
    and FAISS chose to use)."""
    import torch

    model, flags = cpu_model_and_flags()
    info: dict[str, Any] = {
        "model": model or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "flags": None if flags is None else {f: f in flags for f in _CPU_FLAGS},
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
    }
    try:
        import faiss

        info["faiss_compile_options"] = faiss.get_compile_options().strip()
        config = getattr(faiss, "SIMDConfig", None)  # faiss >= 1.13: the level dispatched at run time
        info["faiss_simd_level"] = config.get_level_name() if hasattr(config, "get_level_name") else None
    except ImportError:
        info["faiss_compile_options"] = info["faiss_simd_level"] = None
    return info


def gpu_info() -> list[str]:
    """Names of the visible CUDA devices (empty on a CPU machine)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _git_commit() -> str | None:
    """Commit of the locatdino checkout (``+dirty`` with local changes); None when installed
    from a wheel or git is missing."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def software_versions() -> dict[str, str | None]:
    """Python, locatdino (+ git commit), faiss and the packages in ``_PACKAGES``."""
    import locatdino

    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "locatdino": locatdino.__version__,
        "locatdino_commit": _git_commit(),
    }
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        import faiss

        versions["faiss"] = faiss.__version__
    except ImportError:
        versions["faiss"] = None
    return versions


def run_provenance(checkpoint: str | os.PathLike | None = None) -> dict[str, Any]:
    """Everything above for one run, timestamped now (UTC)."""
    return {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "software": software_versions(),
        "cpu": cpu_info(),
        "gpus": gpu_info(),
        "kernel_env": {k: os.environ[k] for k in _KERNEL_ENV if k in os.environ},
        "checkpoint": checkpoint_record(checkpoint),
    }
