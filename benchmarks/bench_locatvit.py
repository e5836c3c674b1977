"""LocAtViT-S vs ViT-S on the same inputs, in one run: train step, peak memory, eval forward.

    flock /tmp/locatdino-bench.lock .venv/bin/python benchmarks/bench_locatvit.py [--reps 7] [--profile]

- Train step: forward + backward + AdamW on a DINO-like batch (8 crops at 224 px and 32 crops at
  96 px, one forward per resolution, as DINO's student does), loss on the pooled embedding.
- Eval forward at 224 and 448 px (``torch.inference_mode``).
- Timings alternate the two models rep by rep (ABAB…) so load from other processes hits both
  alike. Each time is the process CPU time (``time.process_time``) of one call, minimum over the
  reps; ratio = LocAtViT over ViT. CPU time and 1 intra-op thread by default because the
  development machine is shared: with 2 OpenMP threads a single preempted thread stalls the
  other at every barrier and wall-clock ratios swing by ±50 %. ``--threads 2 --clock wall`` for
  an idle machine.
- Peak memory: each model runs in a fresh subprocess (``--memory-child``) with glibc's mmap
  threshold pinned at 64 KiB, so every tensor buffer is mmapped and returned on free and the
  resident set follows live tensors. After a warm-up step (AdamW state and gradients allocated),
  the kernel's peak-RSS counter is reset (``/proc/self/clear_refs`` ← 5) and one more step runs;
  the reported peak is VmHWM (whole process: weights, gradients, AdamW state, activations) and
  its rise above the resting RSS (activations and temporaries of the step alone).
- ``--profile`` prints where LocAtViT's step time goes (torch profiler, top self-CPU ops).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import locatdino  # noqa: E402,F401  (registers locatvit_*)

MODELS = {"ViT-S": "vit_small_patch16_224", "LocAtViT-S": "locatvit_small_patch16_224"}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=0, dynamic_img_size=True)


def dino_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, 224, 224, generator=g), torch.randn(32, 3, 96, 96, generator=g)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, crops: tuple[torch.Tensor, ...]) -> None:
    loss = sum(model(x).square().mean() for x in crops)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def timed(fn, clock) -> float:
    start = clock()
    fn()
    return clock() - start


def bench_time(reps: int, clock) -> dict[str, dict[str, float]]:
    models = {label: build(name) for label, name in MODELS.items()}
    opts = {label: torch.optim.AdamW(m.parameters(), lr=1e-4) for label, m in models.items()}
    crops = dino_batch()
    evals = {224: torch.randn(8, 3, 224, 224), 448: torch.randn(4, 3, 448, 448)}
    cases = {
        "train step": lambda m, o: train_step(m.train(), o, crops),
        "eval 224 px (8 images)": lambda m, o: _eval(m, evals[224]),
        "eval 448 px (4 images)": lambda m, o: _eval(m, evals[448]),
    }
    results: dict[str, dict[str, list[float]]] = {case: {label: [] for label in models} for case in cases}
    for case, fn in cases.items():
        for label in models:  # warm-up
            fn(models[label], opts[label])
        for _ in range(reps):
            for label in models:
                results[case][label].append(timed(lambda: fn(models[label], opts[label]), clock))
    return {case: {label: min(t) for label, t in per.items()} for case, per in results.items()}


def _eval(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.inference_mode():
        model.eval()(x)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(name: str) -> None:
    """Runs in a fresh process: print the peak RSS of one train step as JSON (MiB)."""
    model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    crops = dino_batch()
    train_step(model.train(), opt, crops)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rest = _status_kib("VmRSS")
    train_step(model, opt, crops)
    peak = _status_kib("VmHWM")
    print(json.dumps({"peak_mib": peak / 1024, "step_mib": (peak - rest) / 1024}))


def bench_memory(reps: int, threads: int) -> dict[str, dict[str, float]]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in MODELS}
    for _ in range(reps):
        for label, name in MODELS.items():
            out = subprocess.run([sys.executable, __file__, "--memory-child", name, "--threads", str(threads)],
                                 env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))
    return {key: {label: statistics.median(r[key] for r in rs) for label, rs in runs.items()}
            for key in ("peak_mib", "step_mib")}


def profile_step(top: int) -> None:
    model = build(MODELS["LocAtViT-S"]).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    crops = dino_batch()
    train_step(model, opt, crops)
    for label, fn in {"train step": lambda: train_step(model, opt, crops),
                      "eval 448 px": lambda: _eval(model, torch.randn(4, 3, 448, 448))}.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\nLocAtViT-S {label}: top {top} ops by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per model and case")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time or wall clock")
    parser.add_argument("--memory-reps", type=int, default=3, help="fresh-process memory runs per model")
    parser.add_argument("--profile", action="store_true", help="print LocAtViT's top ops instead")
    parser.add_argument("--memory-child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_child:
        return memory_child(args.memory_child)
    if args.profile:
        return profile_step(top=15)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} time, min of {args.reps}; "
          "ratios = LocAtViT-S / ViT-S")
    times = bench_time(args.reps, CLOCKS[args.clock])
    for case, t in times.items():
        print(f"{case:24s} ViT-S {t['ViT-S'] * 1e3:8.1f} ms  LocAtViT-S {t['LocAtViT-S'] * 1e3:8.1f} ms  "
              f"ratio {t['LocAtViT-S'] / t['ViT-S']:.3f}")
    memory = bench_memory(args.memory_reps, args.threads)
    for key, label in (("peak_mib", "peak RSS, train step"), ("step_mib", "RSS rise during step")):
        m = memory[key]
        print(f"{label:24s} ViT-S {m['ViT-S']:8.1f} MiB LocAtViT-S {m['LocAtViT-S']:8.1f} MiB "
              f"ratio {m['LocAtViT-S'] / m['ViT-S']:.3f}")


if __name__ == "__main__":
    main()
