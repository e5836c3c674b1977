"""The GPU check's equivalence criterion on the CPU, at full size: does it pass right kernels and
fail a wrong one?

    python -m benchmarks.gpu_check.bf16_criterion_cpu

For each shape (2-block LocAtViT-S, ViT-S width, class token / + 4 registers), against the CPU path
in fp64 (the truth the check judges by): the mask path and the flex path (eager FlexAttention, its
reference backward) in fp32 and bf16 autocast, and both again with a deliberate 1 % error in the
bias (rows × 1.01). Prints each case's verdict under :func:`benchmarks.gpu_check.cases.judge` and
the old max-abs criterion.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

import benchmarks.gpu_check.cases as cases
import locatdino.models.gaug.attention as attention_module
import locatdino.models.gaug.flex_bias_attention as flex_module
from benchmarks.results_io import add_results_option, results_file, write_results

SHAPES = ((0, 96), (4, 224), (0, 448))  # (registers, px)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_results_option(parser, "bf16_criterion_cpu.json")
    args = parser.parse_args()
    args.results = results_file(args, "bf16_criterion_cpu.json")  # before any measuring
    warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
    attend, mask = flex_module._attend, attention_module.outer_product_mask
    biased = {
        "flex": ("_attend", flex_module, lambda q, k, v, r, c, *rest: attend(q, k, v, 1.01 * r, c, *rest)),
        "mask": ("outer_product_mask", attention_module, lambda r, c, p, dt: mask(1.01 * r, c, p, dt)),
    }
    cpu = torch.device("cpu")
    print("| shape | path | dtype | bias | verdict | worst tensor: error (limit) | old max-abs score |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for reg, px in SHAPES:
        start = time.perf_counter()
        model = cases.equivalence_model(cases.FULL, reg)
        names = cases.tensor_names(model)
        g = torch.Generator().manual_seed(px)
        x = torch.randn(2, 3, px, px, generator=g)
        grad_out = torch.randn(2, model.num_prefix_tokens + (px // 16) ** 2, model.embed_dim, generator=g)
        want = cases.forward_backward(model, x, grad_out, cpu, torch.float64, "separable")
        ref_bf16 = cases.forward_backward(model, x, grad_out, cpu, torch.bfloat16, "separable")
        for path in ("mask", "flex"):
            for wrong in (False, True):
                for dtype in (torch.float32, torch.bfloat16):
                    name, module, fn = biased[path]
                    saved = getattr(module, name)
                    if wrong:
                        setattr(module, name, fn)
                    flex_module.reset_flex_state()
                    try:
                        with cases.cpu_flex_backward(path == "flex"):
                            got = cases.forward_backward(model, x, grad_out, cpu, dtype, path)
                    finally:
                        setattr(module, name, saved)
                    v = cases.judge(got, want, names, ref_bf16 if dtype == torch.bfloat16 else None)
                    old = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
                    rows.append(
                        {
                            "px": px,
                            "registers": reg,
                            "path": path,
                            "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
                            "bias_error": wrong,
                            "pass": v.ok,
                            "tensor": v.tensor,
                            "error": v.error,
                            "limit": v.limit,
                            "old_max_abs_score": old,
                        }
                    )
                    print(
                        f"| {px} px, {reg} registers | {path} | {rows[-1]['dtype']} | "
                        f"{'x 1.01' if wrong else 'right'} | {'PASS' if v.ok else 'FAIL'} | "
                        f"{v.tensor}: {v.error:.1e} ({v.limit:.1e}) | {old:.1e} |",
                        flush=True,
                    )
        print(f"({px} px done in {time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        write_results(args.results, "bf16_criterion_cpu.json", {"rows": rows})


if __name__ == "__main__":
    main()
