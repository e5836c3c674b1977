"""What ``benchmarks/gpu_check/`` and its child processes share: the row, the sizes (GPU run or dry
run), the case ids and titles, and small helpers."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from locatdino.models import GAugAttention  # (registers locatvit_*)
from locatdino.models.gaug.flex_bias_attention import error_text
from locatdino.models.gaug.flex_options import HALF_CANDIDATES, FlexOptions

ROOT = Path(__file__).resolve().parents[2]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
PREFIXES = {"cls": (0, "class token"), "reg4": (4, "class + 4 registers")}
EQUIV_LABELS, EVAL_LABELS = (224, 96, 448), (448, 1024)
# the GAug path each equivalence path forces, and its dtypes: fp64 on the device is the maths with
# rounding out of the way (the mask path is plain SDPA, which runs in fp64 everywhere; its fp32
# rows passed on an H200 and are left out to keep the section within its share of the deadline)
GAUG_PATHS = {"flex": "flex", "chunked": "separable", "mask": "mask"}
PATH_DTYPES = {"flex": ("bf16", "fp32"), "chunked": ("bf16", "fp32"), "mask": ("bf16", "fp64")}


@dataclass
class Row:
    section: str
    case: str
    value: str  # one line for the table
    target: str = ""
    status: str = "PASS"  # PASS | FAIL (correctness) | MISS (speed / memory target) | n/a | TIMEOUT
    detail: str = ""  # the whole story (full error text, both errors of a bf16 verdict): results.json only


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the dry run."""

    equiv_model: dict  # timm kwargs of the equivalence LocAtViT (depth, width, heads)
    equiv_px: tuple[int, ...]  # the resolutions, labelled as the full-size ones (224, 96, 448)
    equiv_batch: int
    speed_model: dict  # timm kwargs shared by ViT-S and LocAtViT-S
    head: dict  # DINOHead sizes
    dino_batch: int
    crops_px: tuple[int, int]  # global, local
    local_crops: int
    eval_px: tuple[int, ...]  # labelled 448, 1024
    eval_batch: int
    kernel_shape: tuple[int, int, int, int]  # FlexAttention alone: batch, heads, grid side, head size
    warmup: int  # calls before timing (the first one compiles)
    reps: int


FULL = Sizes(
    equiv_model=dict(depth=2),
    equiv_px=(224, 96, 448),
    equiv_batch=2,
    speed_model={},
    head=dict(out_dim=65536),
    dino_batch=64,
    crops_px=(224, 96),
    local_crops=8,
    eval_px=(448, 1024),
    eval_batch=16,
    kernel_shape=(64, 6, 14, 64),
    warmup=3,
    reps=10,
)
DRY = Sizes(
    equiv_model=dict(img_size=64, depth=1, embed_dim=64, num_heads=2),
    equiv_px=(64, 32, 96),
    equiv_batch=1,
    speed_model=dict(img_size=32, depth=1, embed_dim=64, num_heads=2),
    head=dict(out_dim=64, hidden_dim=32, bottleneck_dim=16),
    dino_batch=2,
    crops_px=(32, 16),
    local_crops=2,
    eval_px=(48, 64),
    eval_batch=1,
    kernel_shape=(2, 2, 3, 16),
    warmup=1,
    reps=1,
)


def equivalence_cases() -> list[str]:
    """Every path and dtype at the three first shapes (each resolution, both prefix kinds), then
    the other three: a budget cut keeps the most telling cases; flex bf16 (the kernel that did
    not compile with torch's default tiles on an H200) first."""
    first = [("224", "cls"), ("96", "reg4"), ("448", "cls")]
    rest = [(str(label), prefix) for prefix in PREFIXES for label in EQUIV_LABELS if (str(label), prefix) not in first]
    return [
        f"{path}-{dtype}-{label}-{prefix}"
        for label, prefix in first + rest
        for path in GAUG_PATHS
        for dtype in PATH_DTYPES[path]
    ]


# the FlexAttention options timed alone: the chooser's list, the same first tiles with bf16 profiles
# (the profiles' dtype measured at equal tiles), torch's default tiles with fp32 profiles (failed on the H200)
KERNEL_OPTIONS = (*HALF_CANDIDATES, FlexOptions(HALF_CANDIDATES[0].kernel, "input"), FlexOptions())
KERNEL_CASES = ["kernel-chooser", "kernel-sdpa", *(f"kernel-{i}" for i in range(len(KERNEL_OPTIONS)))]
SPEED_CASES = ["dino-step", *(f"eval-{label}" for label in EVAL_LABELS)]


def case_title(case: str) -> str:
    """The table's name of a case id (``flex-bf16-96-cls``, ``eval-448``, ``kernel-2``, ...)."""
    if case == "dino-step":
        return "DINO step"
    if case.startswith("eval-"):
        return f"eval {case[5:]} px"
    if case == "kernel-chooser":
        return "options the chooser takes (bf16)"
    if case == "kernel-sdpa":
        return "SDPA without a bias (baseline)"
    if case.startswith("kernel-"):
        return f"flex bf16, {KERNEL_OPTIONS[int(case[7:])].name}"
    path, dtype, label, prefix = case.split("-")
    return f"{path} {dtype} {label} px, {PREFIXES[prefix][1]}"


def set_gaug_path(model: torch.nn.Module, path: str) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, GAugAttention):
            module.gaug_path = path
    return model


@contextlib.contextmanager
def cpu_flex_backward(enabled: bool) -> Iterator[None]:
    """Dry run and CPU demonstrations only: let FlexAttention's reference dense backward run on the CPU."""
    import torch.nn.attention.flex_attention as flex_api

    guard = flex_api._validate_device
    if enabled:
        flex_api._validate_device = lambda *tensors: None
    try:
        yield
    finally:
        flex_api._validate_device = guard


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def error_row(section: str, case: str, exc: BaseException) -> Row:
    """A FAIL row: the error's first line in the table, its whole text in ``detail``; the traceback
    goes to the log."""
    traceback.print_exception(exc, file=sys.stdout)
    text = error_text(exc)
    return Row(section, case, text.splitlines()[0], "no error", "FAIL", detail=text)
