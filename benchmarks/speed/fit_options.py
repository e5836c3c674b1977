"""What ``model.grad_checkpointing`` and ``model.compile`` cost and save in a DINO ``fit`` step on the CPU.

    python -m benchmarks.speed.fit_options [--backbone vit_small_patch16_224] [--steps 6]

Both run ``DINOModule`` under a Lightning ``Trainer.fit`` (its loop, hooks, logging) on the same
in-memory multi-crop batch, the DINO ViT-S/16 recipe's step: 2 global crops of 224 px and 8 local
crops of 96 px per image, 4 images (8 × 224 + 32 × 96 px crops), head of 65,536 prototypes.
Each side runs in a fresh process (one intra-op thread unless ``--threads``).

- ``grad_checkpointing``: peak memory of the second step (the first allocates the gradients and
  AdamW's state), read as in ``benchmarks.speed.locatvit`` (mmap threshold pinned at 64 KiB, the
  kernel's peak-RSS counter reset before the step): the whole process's peak, and its rise above
  the resting RSS (the step's activations and temporaries); the step's process CPU time; the
  losses of both steps (the same up to fp32 rounding: recomputation replays the same operations).
- ``compile``: the whole ``fit`` of ``--steps`` steps, eager against compiled, wall clock,
  compilation included; inductor's cache is a fresh folder, so compilation is paid in full as on
  a new machine. The steady step is the median of the steps after the first two (the compiled
  run recompiles once per backbone and crop size on the second step: GAug's patch-grid record).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.speed.locatvit import _status_kib
from locatdino.ssl import DINOModule

BATCH = 4  # images per step: 2 x 4 global crops, 8 x 4 local crops


class StepProbe(pl.Callback):
    """Per step: the loss, the wall-clock start; before step ``reset_at``, the peak-RSS counter reset."""

    def __init__(self, reset_at: int | None = None) -> None:
        self.reset_at = reset_at
        self.losses: list[float] = []
        self.starts: list[float] = []
        self.rest_kib = 0
        self.cpu_start = 0.0
        self.step_cpu_s = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.reset_at:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
            self.rest_kib = _status_kib("VmRSS")
            self.cpu_start = time.process_time()
        self.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        if batch_idx == self.reset_at:
            self.step_cpu_s = time.process_time() - self.cpu_start


def fit(backbone: str, steps: int, probe: StepProbe, **options) -> None:
    torch.manual_seed(0)
    module = DINOModule(backbone, batch_size=BATCH, warmup_epochs=0.0, **options)
    g = torch.Generator().manual_seed(0)
    batch = {
        "global": torch.randn(2, BATCH, 3, 224, 224, generator=g),
        "local": torch.randn(8, BATCH, 3, 96, 96, generator=g),
    }
    trainer = pl.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        callbacks=[probe],
        accelerator="cpu",
    )
    trainer.fit(module, torch.utils.data.DataLoader([batch] * steps, batch_size=None))


def child(kind: str, backbone: str, steps: int) -> dict:
    """One side, in this (fresh) process."""
    if kind.startswith("memory"):
        probe = StepProbe(reset_at=1)
        fit(backbone, 2, probe, grad_checkpointing=kind == "memory-checkpointed")
        peak = _status_kib("VmHWM")
        return {
            "losses": probe.losses,
            "peak_mib": peak / 1024,
            "step_rise_mib": (peak - probe.rest_kib) / 1024,
            "step_cpu_s": probe.step_cpu_s,
        }
    probe = StepProbe()
    start = time.perf_counter()
    fit(backbone, steps, probe, compile=kind == "fit-compiled")
    total = time.perf_counter() - start
    step_times = [b - a for a, b in zip(probe.starts, probe.starts[1:])]
    return {
        "losses": probe.losses,
        "fit_s": total,
        "first_steps_s": step_times[:2],
        "steady_step_s": statistics.median(step_times[2:]),
    }


def run_child(kind: str, args: argparse.Namespace, cache_dir: str) -> dict:
    env = dict(
        os.environ,
        MALLOC_MMAP_THRESHOLD_="65536",
        MALLOC_TRIM_THRESHOLD_="0",
        TORCHINDUCTOR_CACHE_DIR=cache_dir,
        OMP_NUM_THREADS=str(args.threads),
    )
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--child",
        kind,
        "--backbone",
        args.backbone,
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="vit_small_patch16_224")
    parser.add_argument("--steps", type=int, default=6, help="steps of each fit of the compile comparison")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--parts", nargs="*", choices=("checkpointing", "compile"), default=["checkpointing", "compile"]
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_results_option(parser, "fit_options.json")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error(f"--steps: at least 4 (two to compile, two to time), got {args.steps}")
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(child(args.child, args.backbone, args.steps)))
        return
    results = results_file(args, "fit_options.json")  # before any measuring
    print(
        f"torch {torch.__version__}, {args.backbone}, DINO step of 8 x 224 + 32 x 96 px crops, {args.threads} thread(s)"
    )
    numbers: dict = {"backbone": args.backbone, "threads": args.threads}
    with tempfile.TemporaryDirectory() as cache_dir:
        if "checkpointing" in args.parts:
            off, on = (run_child(kind, args, cache_dir) for kind in ("memory", "memory-checkpointed"))
            numbers["grad_checkpointing"] = {
                "off": off,
                "on": on,
                "peak_ratio": on["peak_mib"] / off["peak_mib"],
                "rise_ratio": on["step_rise_mib"] / off["step_rise_mib"],
                "step_cpu_ratio": on["step_cpu_s"] / off["step_cpu_s"],
            }
            print(
                f"grad_checkpointing: peak {off['peak_mib']:.0f} -> {on['peak_mib']:.0f} MiB "
                f"({on['peak_mib'] / off['peak_mib']:.3f}x), step rise {off['step_rise_mib']:.0f} -> "
                f"{on['step_rise_mib']:.0f} MiB, step CPU {off['step_cpu_s']:.2f} -> {on['step_cpu_s']:.2f} s "
                f"({on['step_cpu_s'] / off['step_cpu_s']:.3f}x); losses {off['losses']} vs {on['losses']}",
                flush=True,
            )
            write_results(results, "fit_options.json", numbers)
        if "compile" in args.parts:
            eager, compiled = (run_child(kind, args, cache_dir) for kind in ("fit-eager", "fit-compiled"))
            saved = eager["steady_step_s"] - compiled["steady_step_s"]
            extra = compiled["fit_s"] - eager["fit_s"]
            numbers["compile"] = {
                "steps": args.steps,
                "eager": eager,
                "compiled": compiled,
                "steady_step_ratio": compiled["steady_step_s"] / eager["steady_step_s"],
                "fit_ratio": compiled["fit_s"] / eager["fit_s"],
                "break_even_steps": extra / saved + args.steps if saved > 0 else None,
            }
            print(
                f"compile, fit of {args.steps} steps: eager {eager['fit_s']:.1f} s, compiled {compiled['fit_s']:.1f} s "
                f"(first two steps {compiled['first_steps_s'][0]:.1f} + {compiled['first_steps_s'][1]:.1f} s); steady "
                f"step {eager['steady_step_s']:.2f} -> {compiled['steady_step_s']:.2f} s "
                f"({compiled['steady_step_s'] / eager['steady_step_s']:.3f}x); losses {eager['losses']} vs "
                f"{compiled['losses']}",
                flush=True,
            )
            write_results(results, "fit_options.json", numbers)


if __name__ == "__main__":
    main()
