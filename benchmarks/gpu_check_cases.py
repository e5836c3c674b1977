"""The cases of ``benchmarks/gpu_check.py`` that run in its child processes: ``equivalence``, ``speed``.

    python benchmarks/gpu_check_cases.py equivalence flex-bf16-96-cls mask-fp32-448-reg4 [--dry-run]
    python benchmarks/gpu_check_cases.py speed dino-step eval-448

Why a child process: a device-side fault (an illegal memory access in a kernel) poisons the CUDA
context of its process, and every later CUDA call there fails. The parent runs the cases here,
reads the protocol lines on stdout (``@@start CASE``, ``@@row {json}``, ``@@done CASE``; every
other line is log) and starts a fresh child for the cases after one that killed its process or
left CUDA unusable, so a fault fails only its own rows.

Equivalence error (:func:`judge`): per tensor (output, input gradient, every parameter gradient)
the relative Frobenius error ``e = ‖a − b‖ / ‖b‖`` against the CPU path in fp32. fp32 results must
be within 1e-4 on every tensor. bf16 results are judged against the error the CPU path itself
makes in bf16 autocast on the same tensor, ``e_ref``: within ``max(1e-3, 1.5·e_ref)``. A right
kernel's bf16 error is set by bf16 rounding of the activations, so it stays near ``e_ref`` (at
most 1.11× on the CPU at full size); a 1 % error in the bias adds a systematic part that takes
the GAug weight gradients to 1.9–2.6× ``e_ref``. Reductions to a handful of numbers (GAug's
``log_var.bias`` and ``log_alpha.bias`` gradients: 2 and 1 entries, sums of many cancelling
terms, ``e_ref`` up to 8e-2) are too noisy to tell either way and only need
``max(2e-2, 4·e_ref)``. The CPU demonstration: ``benchmarks/bf16_criterion_cpu.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from locatdino.models import GAugAttention, GaussianLocalityBias  # noqa: E402  (registers locatvit_*)
import locatdino.models.gaug.flex_bias_attention as flex_module  # noqa: E402
from locatdino.models.gaug.flex_bias_attention import flex_failure  # noqa: E402
from locatdino.ssl import DINOModule, clip_grad_per_tensor_, update_teacher  # noqa: E402

FP32_LIMIT = 1e-4
BF16_FACTOR, BF16_FLOOR = 1.5, 1e-3  # bf16: limit max(floor, factor · e_ref) per tensor ...
TINY, TINY_FACTOR, TINY_FLOOR = 8, 4.0, 2e-2  # ... and for tensors of at most TINY entries
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PREFIXES = {"cls": (0, "class token"), "reg4": (4, "class + 4 registers")}


@dataclass
class Row:
    section: str
    case: str
    value: str
    target: str = ""
    status: str = "PASS"  # PASS | FAIL (correctness) | MISS (speed / memory target) | n/a | TIMEOUT


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
    warmup: int  # calls before timing (the first one compiles)
    reps: int


FULL = Sizes(equiv_model=dict(depth=2), equiv_px=(224, 96, 448), equiv_batch=2, speed_model={},
             head=dict(out_dim=65536), dino_batch=64, crops_px=(224, 96), local_crops=8,
             eval_px=(448, 1024), eval_batch=16, warmup=3, reps=10)
DRY = Sizes(equiv_model=dict(img_size=64, depth=1, embed_dim=64, num_heads=2), equiv_px=(64, 32, 96), equiv_batch=1,
            speed_model=dict(img_size=32, depth=1, embed_dim=64, num_heads=2),
            head=dict(out_dim=64, hidden_dim=32, bottleneck_dim=16), dino_batch=2, crops_px=(32, 16), local_crops=2,
            eval_px=(48, 64), eval_batch=1, warmup=1, reps=1)
EQUIV_LABELS, EVAL_LABELS = (224, 96, 448), (448, 1024)


def equivalence_cases(path: str) -> list[str]:
    """Every resolution and both prefix kinds first (a budget cut keeps the most telling cases)."""
    first = [("224", "cls"), ("96", "reg4"), ("448", "cls")]
    rest = [(str(label), prefix) for prefix in PREFIXES for label in EQUIV_LABELS if (str(label), prefix) not in first]
    return [f"{path}-{dtype}-{label}-{prefix}" for label, prefix in first + rest for dtype in DTYPES]


SPEED_CASES = ["dino-step", *(f"eval-{label}" for label in EVAL_LABELS)]


def case_title(case: str) -> str:
    """The table's name of a case id (``flex-bf16-96-cls``, ``eval-448``, ...)."""
    if case == "dino-step":
        return "DINO step"
    if case.startswith("eval-"):
        return f"eval {case[5:]} px"
    path, dtype, label, prefix = case.split("-")
    return f"{path} {dtype} {label} px, {PREFIXES[prefix][1]}"


# ------------------------------------------------------------------------------------ equivalence


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


def equivalence_model(sizes: Sizes, reg_tokens: int) -> torch.nn.Module:
    """A LocAtViT-S (2 blocks at full size) with GAug weights drawn large so the bias matters."""
    torch.manual_seed(0)
    model = timm.create_model("locatvit_small", num_classes=0, reg_tokens=reg_tokens, **sizes.equiv_model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GaussianLocalityBias):
                for p in module.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.train()


def tensor_names(model: torch.nn.Module) -> list[str]:
    """Names of the tensors :func:`forward_backward` returns, in its order."""
    return ["output", "input gradient", *(f"grad {n}" for n, p in model.named_parameters() if p.requires_grad)]


def forward_backward(model, x, grad_out, device, dtype, path) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient, fp32 on the CPU."""
    model = set_gaug_path(copy.deepcopy(model).to(device), path)
    x = x.to(device).requires_grad_(True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = model.forward_features(x)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x, *params], grad_out.to(device, out.dtype), allow_unused=True)
    return [t.detach().float().cpu() for t in (out, *grads)]


def relative_errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> list[float]:
    """``‖a − b‖_F / ‖b‖_F`` per tensor."""
    assert len(got) == len(want), (len(got), len(want))
    return [((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(got, want)]


@dataclass
class Verdict:
    ok: bool
    tensor: str  # the tensor nearest its limit
    error: float
    limit: float


def judge(got: list[torch.Tensor], want: list[torch.Tensor], names: list[str],
          reference_bf16: list[torch.Tensor] | None = None) -> Verdict:
    """The equivalence criterion (module docstring): fp32 when ``reference_bf16`` is None, else
    bf16 judged against the reference's own bf16 error ``e_ref`` per tensor."""
    errors = relative_errors(got, want)
    if reference_bf16 is None:
        limits = [FP32_LIMIT] * len(errors)
    else:
        limits = [max(TINY_FLOOR, TINY_FACTOR * e) if w.numel() <= TINY else max(BF16_FLOOR, BF16_FACTOR * e)
                  for e, w in zip(relative_errors(reference_bf16, want), want)]
    worst = max(range(len(errors)), key=lambda i: errors[i] / limits[i])
    return Verdict(errors[worst] <= limits[worst], names[worst], errors[worst], limits[worst])


class Equivalence:
    """The cases of one child; references (CPU separable path, fp32 and bf16) made once per shape."""

    def __init__(self, sizes: Sizes, device: torch.device, dry: bool):
        self.sizes, self.device, self.dry = sizes, device, dry
        self.references: dict[tuple[str, int], tuple] = {}

    def inputs(self, prefix: str, px: int) -> tuple:
        if (prefix, px) not in self.references:
            model = equivalence_model(self.sizes, PREFIXES[prefix][0])
            g = torch.Generator().manual_seed(px)
            x = torch.randn(self.sizes.equiv_batch, 3, px, px, generator=g)
            n = model.num_prefix_tokens + (px // 16) ** 2
            grad_out = torch.randn(self.sizes.equiv_batch, n, model.embed_dim, generator=g)
            cpu = torch.device("cpu")
            want = forward_backward(model, x, grad_out, cpu, torch.float32, "separable")
            want_bf16 = forward_backward(model, x, grad_out, cpu, torch.bfloat16, "separable")
            self.references[prefix, px] = model, x, grad_out, want, want_bf16
        return self.references[prefix, px]

    def run(self, case: str) -> Iterator[Row]:
        path, dtype_name, label, prefix = case.split("-")
        px = self.sizes.equiv_px[EQUIV_LABELS.index(int(label))]
        model, x, grad_out, want, want_bf16 = self.inputs(prefix, px)
        dtype = DTYPES[dtype_name]
        flex_module._failure = None  # each case on its own: one shape failing to compile says nothing of the next
        with cpu_flex_backward(self.dry and path == "flex"):
            got = forward_backward(model, x, grad_out, self.device, dtype, path)
        v = judge(got, want, tensor_names(model), want_bf16 if dtype == torch.bfloat16 else None)
        target = f"<= {FP32_LIMIT:.0e}" if dtype == torch.float32 else f"<= {BF16_FACTOR} e_ref"
        yield Row("equivalence", case_title(case), f"{v.error:.1e} ({v.tensor}; limit {v.limit:.1e})", target, "PASS" if v.ok else "FAIL")


# ------------------------------------------------------------------------------------------ speed

SPEED_MODELS = {  # label: (timm name, GAug path)
    "ViT-S": ("vit_small_patch16_224", "auto"),
    "LocAtViT-S": ("locatvit_small", "auto"),
    "LocAtViT-S, materialised bias": ("locatvit_small", "mask"),
}
TARGETS = {"dino-step": 1.10, "eval-448": 1.2, "eval-1024": 1.3}
MEMORY_TARGET = 1.10


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    first_s: float  # the first call: compilation included
    median_s: float  # steady state: after the warm-up calls
    peak_mib: float | None  # peak CUDA memory of one more call (None on the CPU)


def timed(fn: Callable[[], None], sizes: Sizes, device: torch.device) -> Timing:
    def once() -> float:
        start = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - start

    first = once()
    for _ in range(sizes.warmup - 1):
        once()
    median = statistics.median(once() for _ in range(sizes.reps))
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        once()
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    return Timing(first, median, peak)


def dino_step(sizes: Sizes, name: str, path: str, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    module = DINOModule(name, dict(sizes.speed_model), batch_size=sizes.dino_batch, **sizes.head).to(device)
    set_gaug_path(module, path)
    student, teacher, loss_fn = module.student, module.teacher, module.dino_loss
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g, local = sizes.crops_px
    crops = {"global": torch.randn(2, sizes.dino_batch, 3, g, g, device=device),
             "local": torch.randn(sizes.local_crops, sizes.dino_batch, 3, local, local, device=device)}

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            with torch.no_grad():
                teacher_out = module.forward_branch(teacher, [crops["global"]])
                probs = loss_fn.teacher_targets(teacher_out, 0.04)
            loss = loss_fn(module.forward_branch(student, [crops["global"], crops["local"]]), probs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_per_tensor_(params, 3.0)
        opt.step()
        update_teacher(student.parameters(), teacher.parameters(), 0.996)
        loss_fn.update_center(teacher_out)

    return step


def eval_forward(sizes: Sizes, name: str, path: str, px: int, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=0, dynamic_img_size=True, **sizes.speed_model).to(device).eval()
    set_gaug_path(model, path)
    x = torch.randn(sizes.eval_batch, 3, px, px, device=device)

    def forward() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
            model(x)

    return forward


def speed(case: str, sizes: Sizes, device: torch.device, dry: bool) -> Iterator[Row]:
    """One benchmark, the three models one after the other (one resident at a time)."""
    title = case_title(case)
    if case == "dino-step":
        make = lambda name, path: dino_step(sizes, name, path, device)  # noqa: E731
    else:
        px = sizes.eval_px[EVAL_LABELS.index(int(case.split("-")[1]))]
        make = lambda name, path: eval_forward(sizes, name, path, px, device)  # noqa: E731

    def judged(ratio: float, limit: float) -> str:  # toy CPU timings of a dry run prove nothing
        return "n/a" if dry else "MISS" if ratio > limit else "PASS"

    base = None
    for label, (name, path) in SPEED_MODELS.items():
        try:
            t = timed(make(name, path), sizes, device)
        except Exception as exc:  # noqa: BLE001  (e.g. out of memory: report, go on)
            yield error_row("speed", f"{title}: {label}", exc)
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base = t if label == "ViT-S" else base
        ratio = t.median_s / base.median_s if base else float("nan")
        value = f"{t.median_s * 1e3:.1f} ms ({ratio:.2f}x), first call {t.first_s:.1f} s"
        row = Row("speed", f"{title}: {label}", value, "comparison" if "materialised" in label else "")
        if label == "LocAtViT-S":
            row.target, row.status = f"time <= {TARGETS[case]:.2f}x", judged(ratio, TARGETS[case])
            if device.type == "cuda" and flex_failure() is not None:
                row.value, row.status = f"{value}; flex fell back to the mask: {flex_failure()}"[:200], "FAIL"
        yield row
        if t.peak_mib is not None and base is not None:
            mem = t.peak_mib / base.peak_mib
            row = Row("speed", f"{title}: {label}, peak memory", f"{t.peak_mib:.0f} MiB ({mem:.2f}x)")
            if label == "LocAtViT-S":
                row.target, row.status = f"<= {MEMORY_TARGET:.2f}x", judged(mem, MEMORY_TARGET)
            yield row


# ------------------------------------------------------------------------------------------- main


def error_row(section: str, case: str, exc: BaseException) -> Row:
    """A FAIL row naming the error; the traceback goes to the log for the diagnosis."""
    traceback.print_exception(exc, file=sys.stdout)
    first = (str(exc).strip().splitlines() or [""])[0]
    return Row(section, case, f"{type(exc).__name__}: {first}"[:200], "no error", "FAIL")


def cuda_usable(device: torch.device) -> bool:
    """Whether this process can still run CUDA work (a device-side fault poisons the context)."""
    if device.type != "cuda":
        return True
    try:
        (torch.ones(1, device=device) + 1).item()
        torch.cuda.synchronize(device)
        return True
    except Exception:  # noqa: BLE001
        return False


def emit(kind: str, payload: str) -> None:
    print(f"@@{kind} {payload}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("section", choices=("equivalence", "speed"))
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    sizes, device = (DRY, torch.device("cpu")) if args.dry_run else (FULL, torch.device("cuda"))
    warnings.filterwarnings("ignore", "flex_attention called without torch.compile")  # dry run: eager on purpose
    if args.section == "equivalence":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
        equivalence = Equivalence(sizes, device, args.dry_run)
        run = equivalence.run
    else:
        run = lambda case: speed(case, sizes, device, args.dry_run)  # noqa: E731
    for case in args.cases:
        emit("start", case)
        try:
            rows = list(run(case))
        except Exception as exc:  # noqa: BLE001  (one failed case must not hide the others)
            rows = [error_row(args.section, case_title(case), exc)]
        for row in rows:
            emit("row", json.dumps(asdict(row)))
        emit("done", case)
        if not cuda_usable(device):
            print(f"gpu_check_cases: CUDA unusable after {case}; exiting so the parent starts a fresh process")
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
