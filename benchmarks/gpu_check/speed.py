"""The ``kernels`` and ``speed`` cases of ``benchmarks/gpu_check/`` (run in its child processes by
``cases.py``).

``kernels``: FlexAttention with the GAug ``score_mod`` alone, at the shape of the H200 measurements
in ``locatdino/models/gaug/flex_options.py`` (bf16 q/k/v ``[64, 6, 197, 64]``, a 14 × 14 grid and a
class token, fp32 profiles unless an option casts them), forward + backward: first what the chooser
takes (the real code path), then SDPA without a bias (the floor), then each option of
:data:`common.KERNEL_OPTIONS` compiled alone: does it compile, its median time, and its error
against an fp64 dense reference beside the error of SDPA with the bias materialised in bf16 (what
the mask path does). That makes the profiles' dtype a measured choice: the first tiles with fp32 and
with bf16 profiles side by side.

``speed``: ViT-S, LocAtViT-S (auto: FlexAttention), LocAtViT-S on the chunked path (CUDA's
fallback for large inputs) and on the materialised mask, bf16: a DINO step (batch 64 = 2 × 224 +
8 × 96 px crops, 65 536 prototypes), eval forward at 448 and 1024 px (batch 16); the first call
(compilation) apart from the median of 10 calls after 3 warm-up calls; peak memory; ratios over
ViT-S against the targets (step ≤ 1.10×, eval 448 ≤ 1.2×, eval 1024 ≤ 1.3×, peak memory ≤ 1.10×).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import timm
import torch
import torch.nn.functional as F

import locatdino.models.gaug.flex_bias_attention as flex_module
from benchmarks.gpu_check.common import (
    EVAL_LABELS,
    KERNEL_OPTIONS,
    Row,
    Sizes,
    case_title,
    cpu_flex_backward,
    error_row,
    set_gaug_path,
    sync,
)
from locatdino.models.gaug.flex_bias_attention import flex_failure, flex_report
from locatdino.ssl import DINOModule, clip_grad_per_tensor_, update_teacher

SPEED_MODELS = {  # label: (timm name, GAug path)
    "ViT-S": ("vit_small_patch16_224", "auto"),
    "LocAtViT-S": ("locatvit_small_patch16_224", "auto"),
    "LocAtViT-S, chunked bias": ("locatvit_small_patch16_224", "separable"),
    "LocAtViT-S, materialised bias": ("locatvit_small_patch16_224", "mask"),
}
TARGETS = {"dino-step": 1.10, "eval-448": 1.2, "eval-1024": 1.3}
MEMORY_TARGET = 1.10


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


# ---------------------------------------------------------------------------------------- kernels


def kernel_inputs(sizes: Sizes, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v (bf16), rows, cols (fp32) with gradients, and an output gradient."""
    batch, heads, side, d = sizes.kernel_shape
    g = torch.Generator(device=device).manual_seed(0)
    n = 1 + side * side
    q, k, v = (torch.randn(batch, heads, n, d, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    rows = 2 * torch.rand(batch, heads, side * side, side, generator=g, device=device)  # a bias up to 4
    cols = 2 * torch.rand(batch, heads, side * side, side, generator=g, device=device)
    grad = torch.randn(batch, heads, n, d, generator=g, device=device, dtype=torch.bfloat16)
    return (*(t.requires_grad_(True) for t in (q, k, v, rows, cols)), grad)


def dense_bias(rows: torch.Tensor, cols: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """The ``[B, H, N, N]`` bias (zero prefix rows and columns) from the profiles, autograd-tracked."""
    B, H, m, h = rows.shape
    bias = (rows[..., :, None] * cols[..., None, :]).reshape(B, H, m, m)
    return F.pad(bias, (num_prefix, 0, num_prefix, 0))


def attention_errors(attend: Callable[..., torch.Tensor], inputs: tuple, truth: list[torch.Tensor]) -> str:
    """Relative errors of the output and the q and rows gradients against ``truth``."""
    *tensors, grad = inputs
    out = attend(*tensors)
    got = [out, *torch.autograd.grad(out, [tensors[0], tensors[3]], grad)]
    errors = [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, truth)]
    return ", ".join(f"{name} {e:.1e}" for name, e in zip(("out", "dq", "drows"), errors))


def kernels(case: str, sizes: Sizes, device: torch.device, dry: bool) -> Iterator[Row]:
    inputs = kernel_inputs(sizes, device)
    *tensors, grad = inputs
    scale = tensors[0].shape[-1] ** -0.5
    leaves = [t.detach().double().requires_grad_(True) for t in tensors]
    truth_out = F.scaled_dot_product_attention(*leaves[:3], attn_mask=dense_bias(*leaves[3:], 1))
    truth = [truth_out, *torch.autograd.grad(truth_out, [leaves[0], leaves[3]], grad.double())]
    title = case_title(case)

    def measure(attend: Callable[..., torch.Tensor]) -> tuple[Timing, str]:
        def step() -> None:
            out = attend(*tensors)
            torch.autograd.grad(out, tensors, grad, allow_unused=True)

        return timed(step, sizes, device), attention_errors(attend, inputs, truth)

    if case == "kernel-sdpa":
        t = timed(
            lambda: torch.autograd.grad(F.scaled_dot_product_attention(*tensors[:3]), tensors[:3], grad), sizes, device
        )
        mask_bf16 = lambda q, k, v, r, c: F.scaled_dot_product_attention(  # noqa: E731
            q, k, v, attn_mask=dense_bias(r, c, 1).to(q.dtype)
        )
        errors = attention_errors(mask_bf16, inputs, truth)
        yield Row(
            "kernels",
            title,
            f"{t.median_s * 1e3:.2f} ms forward + backward",
            "",
            "n/a",
            f"the materialised bf16 bias (mask path) errs {errors} against the fp64 reference",
        )
        return
    flex_module.reset_flex_state()
    with cpu_flex_backward(dry):
        if case == "kernel-chooser":
            attend = lambda q, k, v, r, c: flex_module.flex_bias_attention(q, k, v, r, c, 1, scale)  # noqa: E731
            try:
                t, errors = measure(attend)
            except flex_module.FlexAttentionUnavailable as exc:
                yield Row(
                    "kernels", title, "every option failed", "an option compiles", "FAIL", flex_failure() or str(exc)
                )
                return
            chosen = ", ".join(flex_report()["chosen"].values())
            failed = "".join(f"\n{e['options']}: {e['error']}" for e in flex_report()["failed"])
            yield Row(
                "kernels",
                title,
                f"{chosen}: {t.median_s * 1e3:.2f} ms, first call {t.first_s:.1f} s",
                "an option compiles",
                "PASS",
                f"errors {errors}" + (f"; failed before:{failed}" if failed else ""),
            )
            return
        options = KERNEL_OPTIONS[int(case.removeprefix("kernel-"))]
        compiled = flex_module._kernel(device)
        attend = lambda *five: flex_module._run(compiled, five, 1, scale, options)  # noqa: E731
        try:
            t, errors = measure(attend)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (an option that does not compile is a finding, not a failure)
            row = error_row("kernels", title, exc)
            row.target, row.status = "", "n/a"
            yield row
            return
    yield Row(
        "kernels",
        title,
        f"{t.median_s * 1e3:.2f} ms forward + backward, first call {t.first_s:.1f} s",
        "",
        "n/a",
        f"errors against the fp64 reference: {errors}",
    )


# ------------------------------------------------------------------------------------------ speed


def dino_step(sizes: Sizes, name: str, path: str, device: torch.device) -> Callable[[], None]:
    torch.manual_seed(0)
    module = DINOModule(name, dict(sizes.speed_model), batch_size=sizes.dino_batch, **sizes.head).to(device)
    set_gaug_path(module, path)
    student, teacher, loss_fn = module.student, module.teacher, module.dino_loss
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g, local = sizes.crops_px
    crops = {
        "global": torch.randn(2, sizes.dino_batch, 3, g, g, device=device),
        "local": torch.randn(sizes.local_crops, sizes.dino_batch, 3, local, local, device=device),
    }

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
    """One benchmark, the models one after the other (one resident at a time)."""
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
        row = Row("speed", f"{title}: {label}", value, "" if label in ("ViT-S", "LocAtViT-S") else "comparison")
        if label == "LocAtViT-S":
            row.target, row.status = f"time <= {TARGETS[case]:.2f}x", judged(ratio, TARGETS[case])
            row.detail = f"flex options: {flex_report()['chosen']}"
            if device.type == "cuda" and flex_failure() is not None:
                row.value, row.status = f"{value}; FlexAttention fell back", "FAIL"
                row.detail = flex_failure()
        yield row
        if t.peak_mib is not None and base is not None:
            mem = t.peak_mib / base.peak_mib
            row = Row("speed", f"{title}: {label}, peak memory", f"{t.peak_mib:.0f} MiB ({mem:.2f}x)")
            if label == "LocAtViT-S":
                row.target, row.status = f"<= {MEMORY_TARGET:.2f}x", judged(mem, MEMORY_TARGET)
            yield row
