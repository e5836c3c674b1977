"""The cases of ``benchmarks/gpu_check/`` that run in its child processes: ``kernels``,
``equivalence`` (here), ``speed`` (``speed.py``).

    python -m benchmarks.gpu_check.cases equivalence flex-bf16-96-cls mask-fp64-448-reg4 [--dry-run]
    python -m benchmarks.gpu_check.cases speed dino-step eval-448
    python -m benchmarks.gpu_check.cases kernels kernel-chooser kernel-0

Why a child process: a device-side fault (an illegal memory access in a kernel) poisons the CUDA
context of its process, and every later CUDA call there fails. The parent runs the cases here,
reads the protocol lines on stdout (``@@start CASE``, ``@@row {json}``, ``@@done CASE``; every
other line is log, the GAug loggers at DEBUG: the kernel options chosen, every failure's full
text and traceback) and starts a fresh child for the cases after one that killed its process or
left CUDA unusable, so a fault fails only its own rows.

Equivalence (:func:`judge`): a 2-block LocAtViT-S forward and backward through one GAug path on
the device (``flex``: FlexAttention with the options its chooser takes; ``chunked``: the
separable path forced into 16-row chunks, CUDA's path for large inputs without FlexAttention;
``mask``: SDPA with the materialised bias), per tensor (output, input gradient, every parameter
gradient) against the **truth: the CPU path in fp64**. The error is the relative Frobenius error
``e = ‖a − t‖ / ‖t‖``. fp64 results must be within 1e-10 (the maths, rounding out of the way),
fp32 within 1e-4. bf16 results are judged against the error the CPU path makes in bf16 autocast
against the same truth, ``e_cpu``: within ``max(1e-3, 1.5·e_cpu)`` (both errors and their ratio
are in the row's detail, so a GPU whose bf16 rounding is legitimately a little worse than the
CPU's is told from a kernel that loses precision: the fp64 and fp32 rows of the same shape say
whether its maths is right). A right kernel's bf16 error is set by bf16 rounding of the
activations, so it stays near ``e_cpu`` (at most 1.11× on the CPU at full size); a 1 % error in
the bias adds a systematic part that takes the GAug weight gradients to 1.9–2.6× ``e_cpu``.
Reductions to a handful of numbers (GAug's ``log_var.bias`` and ``log_alpha.bias`` gradients: 2
and 1 entries, sums of many cancelling terms, ``e_cpu`` up to 8e-2) are too noisy to tell either
way and only need ``max(2e-2, 4·e_cpu)``. The CPU demonstration: ``benchmarks/gpu_check/bf16_criterion_cpu.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import timm
import torch

import locatdino.models.gaug.flex_bias_attention as flex_module
import locatdino.models.gaug.separable_bias_attention as separable_module
from benchmarks.gpu_check.common import (
    DRY,
    DTYPES,
    EQUIV_LABELS,
    FULL,
    GAUG_PATHS,
    PREFIXES,
    Row,
    Sizes,
    case_title,
    cpu_flex_backward,
    error_row,
    set_gaug_path,
)
from locatdino.models import GaussianLocalityBias

FP32_LIMIT, FP64_LIMIT = 1e-4, 1e-10
BF16_FACTOR, BF16_FLOOR = 1.5, 1e-3  # bf16: limit max(floor, factor · e_cpu) per tensor ...
TINY, TINY_FACTOR, TINY_FLOOR = 8, 4.0, 2e-2  # ... and for tensors of at most TINY entries


def equivalence_model(sizes: Sizes, reg_tokens: int) -> torch.nn.Module:
    """A LocAtViT-S (2 blocks at full size) with GAug weights drawn large so the bias matters."""
    torch.manual_seed(0)
    model = timm.create_model("locatvit_small_patch16_224", num_classes=0, reg_tokens=reg_tokens, **sizes.equiv_model)
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
    """Output, input gradient and every parameter gradient, fp64 on the CPU. bf16: autocast over
    fp32 weights (as in training); fp64: the model and its input in fp64."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    model = set_gaug_path(copy.deepcopy(model).to(device, wide), path)
    x = x.to(device, wide).requires_grad_(True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = model.forward_features(x)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x, *params], grad_out.to(device, out.dtype), allow_unused=True)
    return [t.detach().cpu().double() for t in (out, *grads)]


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
    reference_error: float | None = None  # bf16: the CPU path's own bf16 error on that tensor


def judge(
    got: list[torch.Tensor],
    truth: list[torch.Tensor],
    names: list[str],
    reference_bf16: list[torch.Tensor] | None = None,
    limit: float = FP32_LIMIT,
) -> Verdict:
    """The equivalence criterion (module docstring): ``limit`` on every tensor when
    ``reference_bf16`` is None, else bf16 judged against the reference's own bf16 error per tensor."""
    errors = relative_errors(got, truth)
    references = relative_errors(reference_bf16, truth) if reference_bf16 is not None else None
    if references is None:
        limits = [limit] * len(errors)
    else:
        limits = [
            max(TINY_FLOOR, TINY_FACTOR * e) if t.numel() <= TINY else max(BF16_FLOOR, BF16_FACTOR * e)
            for e, t in zip(references, truth)
        ]
    worst = max(range(len(errors)), key=lambda i: errors[i] / limits[i])
    return Verdict(
        errors[worst] <= limits[worst],
        names[worst],
        errors[worst],
        limits[worst],
        references[worst] if references else None,
    )


@contextlib.contextmanager
def small_chunks(enabled: bool) -> Iterator[None]:
    """The chunked path in 16-row chunks on every device (so a check at small sizes runs many chunks)."""
    names = ("_CHUNK_BYTES", "_EVAL_CHUNK_BYTES", "_CUDA_CHUNK_BYTES")
    saved = {name: getattr(separable_module, name) for name in names}
    if enabled:
        for name in names:
            setattr(separable_module, name, 1)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(separable_module, name, value)


class Equivalence:
    """The cases of one child; references (CPU separable path, fp64 truth and bf16) made once per shape."""

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
            truth = forward_backward(model, x, grad_out, cpu, torch.float64, "separable")
            cpu_bf16 = forward_backward(model, x, grad_out, cpu, torch.bfloat16, "separable")
            self.references[prefix, px] = model, x, grad_out, truth, cpu_bf16
        return self.references[prefix, px]

    def run(self, case: str) -> Iterator[Row]:
        path, dtype_name, label, prefix = case.split("-")
        px = self.sizes.equiv_px[EQUIV_LABELS.index(int(label))]
        model, x, grad_out, truth, cpu_bf16 = self.inputs(prefix, px)
        dtype = DTYPES[dtype_name]
        flex_module.reset_flex_state()  # each case on its own: one shape failing to compile says nothing of the next
        with cpu_flex_backward(self.dry and path == "flex"), small_chunks(path == "chunked"):
            got = forward_backward(model, x, grad_out, self.device, dtype, GAUG_PATHS[path])
        names = tensor_names(model)
        if dtype == torch.bfloat16:
            v, target = judge(got, truth, names, cpu_bf16), f"<= {BF16_FACTOR} e_cpu"
            detail = (
                f"{v.tensor}: device bf16 error {v.error:.3e}, CPU bf16 error {v.reference_error:.3e} (both "
                f"against the CPU fp64 truth), ratio {v.error / max(v.reference_error, 1e-30):.2f}"
            )
        else:
            limit = FP64_LIMIT if dtype == torch.float64 else FP32_LIMIT
            v, target = judge(got, truth, names, limit=limit), f"<= {limit:.0e}"
            detail = f"{v.tensor}: error {v.error:.3e} against the CPU fp64 truth"
        if path == "flex":
            detail += f"; flex options: {flex_module.flex_report()['chosen']}"
        yield Row(
            "equivalence",
            case_title(case),
            f"{v.error:.1e} ({v.tensor}; limit {v.limit:.1e})",
            target,
            "PASS" if v.ok else "FAIL",
            detail,
        )


# ------------------------------------------------------------------------------------------- main


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
    parser.add_argument("section", choices=("kernels", "equivalence", "speed"))
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    sizes, device = (DRY, torch.device("cpu")) if args.dry_run else (FULL, torch.device("cuda"))
    warnings.filterwarnings("ignore", "flex_attention called without torch.compile")  # dry run: eager on purpose
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("locatdino.models.gaug").setLevel(logging.DEBUG)  # options chosen, full errors
    if args.section == "equivalence":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
        run = Equivalence(sizes, device, args.dry_run).run
    else:
        from benchmarks.gpu_check.speed import kernels, speed

        section = speed if args.section == "speed" else kernels
        run = lambda case: section(case, sizes, device, args.dry_run)  # noqa: E731
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
            print(f"gpu_check.cases: CUDA unusable after {case}; exiting so the parent starts a fresh process")
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
