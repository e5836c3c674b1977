"""LocAtViT-S vs ViT-S on the same inputs, in one run: train step, peak memory, eval forward.

    python -m benchmarks.speed.locatvit [--reps 7] [--profile]

- Models: ViT-S (timm ``vit_small_patch16_224``), ViT-S + PRR only (``locatify(gaug=False)``,
  to split the cost of the two add-ons) and LocAtViT-S, all ``num_classes=0``, same init seed.
- Train step: forward + backward + AdamW on a DINO-like batch (8 crops at 224 px and 32 crops at
  96 px, one forward per resolution, as DINO's student does), loss on the pooled embedding.
- Eval forward at 224, 448 and 1024 px (``torch.inference_mode``; GAug's CPU path then takes its
  evaluation path: the bias added by the ``q kᵀ`` product, per chunk of heads). The 1024 px case
  runs at most 3 reps.
- Timings alternate the models rep by rep (ABCABC…) so load from other processes hits all alike.
  Each time is the process CPU time (``time.process_time``) of one call, minimum over the reps;
  ratios are over ViT-S: the ratio of the minima, and the median over reps of each rep's ratio
  (the three calls of a rep run back to back, so the host's slow and fast spells cancel; the ratio
  of minima rests on each model's single luckiest call and moved by ±4 % between runs of the same
  code on the development machine). CPU time and 1 intra-op thread by default because the development
  machine is shared: with 2 OpenMP threads one preempted thread stalls the other at every
  barrier and wall-clock ratios swing by ±50 %. ``--threads 2 --clock wall`` for an idle machine.
- Peak memory (ViT-S and LocAtViT-S): each model runs in a fresh subprocess with glibc's mmap
  threshold pinned at 64 KiB, so every tensor buffer is mmapped and returned on free and the
  resident set follows live tensors (``tracemalloc`` does not see torch's allocations). After a
  warm-up step (AdamW state and gradients allocated), the kernel's peak-RSS counter is reset
  (``/proc/self/clear_refs`` ← 5) and one more step runs; reported: VmHWM (whole process:
  weights, gradients, AdamW state, activations) and its rise above the resting RSS
  (activations and temporaries of the step alone). Median over ``--memory-reps`` processes.
- ``--profile`` prints where LocAtViT's time goes (torch profiler, top self-CPU ops).
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

from benchmarks.results_io import add_results_option, results_file, write_results
from locatdino.models import locatify  # (importing locatdino registers locatvit_*)

MODELS = ("ViT-S", "ViT-S + PRR", "LocAtViT-S")
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def build(label: str) -> torch.nn.Module:
    torch.manual_seed(0)
    name = "locatvit_small_patch16_224" if label == "LocAtViT-S" else "vit_small_patch16_224"
    model = timm.create_model(name, num_classes=0, dynamic_img_size=True)
    return locatify(model, gaug=False) if label == "ViT-S + PRR" else model


def dino_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 3, 224, 224, generator=g), torch.randn(32, 3, 96, 96, generator=g)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, crops: tuple[torch.Tensor, ...]) -> None:
    loss = sum(model(x).square().mean() for x in crops)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def evaluate(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.inference_mode():
        model.eval()(x)


def bench_time(reps: int, clock) -> dict[str, dict[str, list[float]]]:
    models = {label: build(label) for label in MODELS}
    opts = {label: torch.optim.AdamW(m.parameters(), lr=1e-4) for label, m in models.items()}
    crops = dino_batch()
    x224, x448, x1024 = torch.randn(8, 3, 224, 224), torch.randn(4, 3, 448, 448), torch.randn(1, 3, 1024, 1024)
    cases = {
        "train step": lambda m, o: train_step(m.train(), o, crops),
        "eval 224 px (8 images)": lambda m, o: evaluate(m, x224),
        "eval 448 px (4 images)": lambda m, o: evaluate(m, x448),
        "eval 1024 px (1 image)": lambda m, o: evaluate(m, x1024),
    }
    times: dict[str, dict[str, list[float]]] = {}
    for case, fn in cases.items():
        for label in MODELS:  # warm-up
            fn(models[label], opts[label])
        runs: dict[str, list[float]] = {label: [] for label in MODELS}
        for _ in range(min(reps, 3) if "1024" in case else reps):
            for label in MODELS:
                start = clock()
                fn(models[label], opts[label])
                runs[label].append(clock() - start)
        times[case] = runs
    return times


def paired_ratio(runs: dict[str, list[float]], label: str) -> float:
    """Median over reps of ``label``'s time over ViT-S's in the same rep."""
    return statistics.median(t / base for t, base in zip(runs[label], runs["ViT-S"]))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(label: str) -> None:
    """Runs in a fresh process: print the peak RSS of one train step as JSON (MiB)."""
    model = build(label)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    crops = dino_batch()
    train_step(model.train(), opt, crops)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rest = _status_kib("VmRSS")
    train_step(model, opt, crops)
    peak = _status_kib("VmHWM")
    print(json.dumps({"peak_mib": peak / 1024, "step_mib": (peak - rest) / 1024}))


def bench_memory(reps: int, threads: int, labels: tuple[str, ...]) -> dict[str, dict[str, float]]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    for _ in range(reps):
        for label in labels:
            cmd = [sys.executable, "-m", __spec__.name, "--memory-child", label, "--threads", str(threads)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))
    return {
        key: {label: statistics.median(r[key] for r in rs) for label, rs in runs.items()}
        for key in ("peak_mib", "step_mib")
    }


def profile(top: int) -> None:
    model = build("LocAtViT-S").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    crops = dino_batch()
    train_step(model, opt, crops)
    x448 = torch.randn(4, 3, 448, 448)
    for label, fn in {
        "train step": lambda: train_step(model, opt, crops),
        "eval 448 px": lambda: evaluate(model, x448),
    }.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        print(f"\nLocAtViT-S {label}: top {top} ops by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per model and case")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="process CPU time or wall clock")
    parser.add_argument("--memory-reps", type=int, default=3, help="fresh-process memory runs per model (0: none)")
    parser.add_argument("--profile", action="store_true", help="print LocAtViT's top ops instead")
    parser.add_argument("--memory-child", metavar="MODEL", help=argparse.SUPPRESS)
    add_results_option(parser, "locatvit.json")
    args = parser.parse_args()
    args.results = results_file(args, "locatvit.json")  # before any measuring
    torch.set_num_threads(args.threads)
    if args.memory_child:
        return memory_child(args.memory_child)
    if args.profile:
        return profile(top=15)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} time, min of {args.reps}")
    print("ratios over ViT-S: of the minima / median of the per-rep ratios")
    print(f"{'':24s} {'ViT-S':>10s} {'+PRR ratio':>13s} {'LocAtViT-S':>11s} {'ratio':>13s}")
    runs = bench_time(args.reps, CLOCKS[args.clock])
    times = {case: {label: min(r) for label, r in by_label.items()} for case, by_label in runs.items()}
    paired = {case: {label: paired_ratio(by_label, label) for label in MODELS[1:]} for case, by_label in runs.items()}
    for case, t in times.items():
        base, p = t["ViT-S"], paired[case]
        print(
            f"{case:24s} {base * 1e3:7.1f} ms {t['ViT-S + PRR'] / base:6.3f} {p['ViT-S + PRR']:6.3f} "
            f"{t['LocAtViT-S'] * 1e3:8.1f} ms {t['LocAtViT-S'] / base:6.3f} {p['LocAtViT-S']:6.3f}"
        )
    numbers = {"seconds": times, "median_paired_ratio": paired}
    if not args.memory_reps:
        return write_results(args.results, "locatvit.json", numbers)
    memory = bench_memory(args.memory_reps, args.threads, ("ViT-S", "LocAtViT-S"))
    for key, label in (("peak_mib", "peak RSS, train step"), ("step_mib", "RSS rise during step")):
        m = memory[key]
        print(
            f"{label:24s} {m['ViT-S']:6.0f} MiB {'':11s} {m['LocAtViT-S']:7.0f} MiB {m['LocAtViT-S'] / m['ViT-S']:7.3f}"
        )
    write_results(args.results, "locatvit.json", {**numbers, "memory": memory})


if __name__ == "__main__":
    main()
