"""What ``torch.compile`` (inductor) buys LocAtViT-S on the CPU, same run, vs eager.

    python -m benchmarks.speed.compile [--reps 5]

- Eval forward at 224 px (8 images) and 448 px (4 images), ``torch.inference_mode``.
- DINO step: teacher forward on the 2 global crops, student forward on 2 × 4 global crops at
  224 px and 8 × 4 local crops at 96 px (one forward per resolution, as ``DINOModule`` does),
  DINO loss, backward, AdamW, EMA teacher (``DINOModule`` parts, head 4096 wide).
- Compiled: ``module.compile(dynamic=False)`` on a deep copy of the same weights (backbones only
  for the DINO step: the head and loss are a few matmuls), inductor with its C++ kernels; the
  fused GAug CPU kernel stays an opaque custom operator. The first call (compilation) is timed
  apart. Then eager and compiled alternate rep by rep; each time is the process CPU time of one
  call at 1 intra-op thread (the machine is shared; see locatvit.py), minimum over reps.
"""

from __future__ import annotations

import argparse
import copy
import time

import timm
import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.ssl import DINOModule, update_teacher

MODEL = "locatvit_small_patch16_224"


def eval_case(size: int, batch: int):
    torch.manual_seed(0)
    model = timm.create_model(MODEL, num_classes=0).eval()
    x = torch.randn(batch, 3, size, size)

    def make(compiled: bool):
        m = copy.deepcopy(model)
        if compiled:
            m.compile(dynamic=False)

        def call() -> None:
            with torch.inference_mode():
                m(x)

        return call

    return make


def dino_case():
    torch.manual_seed(0)
    module = DINOModule(MODEL, out_dim=4096, hidden_dim=2048, bottleneck_dim=256, batch_size=4)
    batch = {"global": torch.randn(2, 4, 3, 224, 224), "local": torch.randn(8, 4, 3, 96, 96)}

    def make(compiled: bool):
        m = copy.deepcopy(module)
        if compiled:
            m.student["backbone"].compile(dynamic=False)
            m.teacher["backbone"].compile(dynamic=False)
        opt = torch.optim.AdamW(m.student.parameters(), lr=1e-4)

        def call() -> None:
            with torch.no_grad():
                probs = m.dino_loss.teacher_targets(m.forward_branch(m.teacher, [batch["global"]]), 0.04)
            loss = m.dino_loss(m.forward_branch(m.student, [batch["global"], batch["local"]]), probs)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            update_teacher(m.student.parameters(), m.teacher.parameters(), 0.996)

        return call

    return make


CASES = {
    "eval 224 px, 8 images": lambda: eval_case(224, 8),
    "eval 448 px, 4 images": lambda: eval_case(448, 4),
    "DINO step (8 × 224 px + 32 × 96 px)": dino_case,
}


def cpu_time(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    add_results_option(parser, "compile.json")
    args = parser.parse_args()
    args.results = results_file(args, "compile.json")  # before any measuring
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {MODEL}, {args.threads} thread(s), process CPU time, min of {args.reps}")
    print(f"{'case':<38} {'eager s':>8} {'compiled s':>11} {'compiled/eager':>15} {'compile s':>10}")
    # every compiled model shares VisionTransformer.forward's code object: one cache entry per
    # (model, resolution, grad mode); a DINO step alone needs 3 (teacher, student at 2 sizes)
    torch._dynamo.config.recompile_limit = 64
    rows = {}
    for name in args.cases:
        torch._dynamo.reset()
        make = CASES[name]()
        eager, compiled = make(False), make(True)
        eager()  # warm-up (scratch buffers, allocator)
        first = cpu_time(compiled) + cpu_time(compiled)  # compilation (+ a recompile-free second call)
        times = {"eager": [], "compiled": []}
        for _ in range(args.reps):
            times["eager"].append(cpu_time(eager))
            times["compiled"].append(cpu_time(compiled))
        te, tc = min(times["eager"]), min(times["compiled"])
        print(f"{name:<38} {te:8.3f} {tc:11.3f} {tc / te:15.3f} {first - tc:10.0f}", flush=True)
        rows[name] = {"eager_s": te, "compiled_s": tc, "compile_s": first - tc}
        write_results(args.results, "compile.json", {"model": MODEL, "cases": rows})


if __name__ == "__main__":
    main()
