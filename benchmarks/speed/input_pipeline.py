"""Does the input keep up? The CPU and GPU multi-crop paths against the bare DINO step.

For each recipe (``tiny``: configs/dino_tiny_cpu.yaml with LocAtViT-T/8 at 64 px; ``vits``:
configs/dino_small_ddp.yaml, ViT-S/16 at 2 × 224 + 8 × 96 px), built as ``locatdino fit`` builds it
(``build_cli``) with the batch, worker count and ``augment_on`` of the run:

- **bare step**: the recipe's DINO step on an in-memory batch, no loader, no Lightning
  (``mfu.DinoStep``, eager; bf16 autocast on CUDA, the recipe's fp32 on the CPU);
- **loader alone**, per path: batches from the shards through the DataLoader workers, moved to
  the device, and (``gpu`` path) augmented there by the batch hook, nothing trained;
- **fit**, per path: ``locatdino fit`` of the recipe for ``--steps`` steps (bf16-mixed on CUDA),
  images/s from the steps after the fifth (``benchmarks.gpu_check.step_times.StepTimes``).

Every rate is reported with its ratio to the bare step's; the target is fit ≥ 0.9 of it
on one GPU. The shards hold JPEGs (quality 90) of the built-in scenes at the recipe's size (96 px
for tiny, 448 × 448 for ViT-S, about an ImageNet photo's pixels), 64 distinct images repeated.
On a CPU-only machine the ``gpu`` path runs on CPU tensors in the training process.

    python -m benchmarks.speed.input_pipeline --device cuda --out pipeline_run          # one GPU
    python -m benchmarks.speed.input_pipeline \\
        --device cpu --recipes tiny vits --fit-recipes tiny --steps 25 --out runs/bench_pipeline
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from PIL import Image

from benchmarks.results_io import add_results_option, results_file, write_results
from benchmarks.speed.mfu import DinoStep, median_step_s
from locatdino.data.scenes import render_scene, scene_rng
from locatdino.data.shards.sources import FolderSource
from locatdino.data.shards.writer import write_shards
from locatdino.ssl.run.cli import build_cli

ROOT = Path(__file__).resolve().parents[2]

RECIPES = {  # name: (recipe and its --model.backbone, JPEG side, (batch, workers) on CUDA, (batch, workers) on the CPU)
    "tiny": (("dino_tiny_cpu", "locatvit_tiny_patch8_224"), 96, (256, 12), (32, 1)),
    "vits": (("dino_small_ddp", "vit_small_patch16_224"), 448, (64, 12), (8, 1)),
}
FIT_SKIP_STEPS = 5
DISTINCT_IMAGES = 64


def write_jpeg_shards(folder: Path, n: int, px: int) -> Path:
    """``n`` JPEGs (quality 90) of ``DISTINCT_IMAGES`` built-in scenes at ``px`` px, as shards."""
    shards = folder / f"shards_{px}px_{n}"
    if (shards / "index.json").is_file():
        return shards
    images = folder / f"jpegs_{px}px"
    images.mkdir(parents=True, exist_ok=True)
    distinct = [images / f"{i:05d}.jpg" for i in range(min(n, DISTINCT_IMAGES))]
    for i, path in enumerate(distinct):
        Image.fromarray(render_scene(scene_rng(0, i), px, px)[0]).save(path, quality=90)
    for i in range(len(distinct), n):
        shutil.copyfile(distinct[i % len(distinct)], images / f"{i:05d}.jpg")
    write_shards(FolderSource(images), shards, maxcount=max(1, n // 16), progress=False)
    return shards


def recipe_args(
    recipe: tuple[str, str], shards: Path, batch: int, workers: int, path: str, device: torch.device
) -> list[str]:
    """``locatdino fit`` arguments: the recipe and its backbone, these shards, one epoch longer than any run."""
    precision = ["--trainer.precision", "bf16-mixed"] if device.type == "cuda" else []
    return [
        "--config",
        recipe[0],
        "--model.backbone",
        recipe[1],
        "--data.init_args.train_urls",
        str(shards),
        "--data.init_args.synthetic",
        "0",
        "--data.init_args.batch_size",
        str(batch),
        "--data.init_args.num_workers",
        str(workers),
        "--data.init_args.augment_on",
        path,
        "--data.init_args.batches_per_epoch",
        "100000",
        "--trainer.accelerator",
        "gpu" if device.type == "cuda" else "cpu",
        "--trainer.devices",
        "1",
        *precision,
    ]


def bare_images_per_s(args: list[str], device: torch.device, reps: int) -> float:
    cli = build_cli(args, run=False)
    data, module = cli.datamodule, cli.model
    mc = data.multicrop
    step = DinoStep(
        module,
        data.batch_size,
        (mc.global_crop_size, mc.local_crop_size, mc.num_local_crops),
        device,
        autocast=device.type == "cuda",
    )
    _, median = median_step_s(step, device, warmup=3, reps=reps)
    return data.batch_size / median


def loader_images_per_s(args: list[str], device: torch.device, batches: int, skip: int = 3) -> float:
    """Batches/s of the loader (and the device augmentation) alone, after ``skip`` start-up batches."""
    data = build_cli(args, run=False).datamodule
    data.setup("fit")
    times = []
    for i, batch in enumerate(data.train_dataloader()):
        batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        batch = data.on_after_batch_transfer(batch, 0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter())
        if i + 1 == skip + batches:
            break
    return data.batch_size * batches / (times[-1] - times[skip - 1])


def fit_images_per_s(
    args: list[str], batch: int, steps: int, run_dir: Path, timeout: float, threads: int | None
) -> float:
    """``locatdino fit`` in a subprocess; images/s over the steps after the fifth."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    threads_args = ["--threads", str(threads)] if threads else []
    command = [
        sys.executable,
        "-m",
        "locatdino",
        *threads_args,
        "fit",
        *args,
        "--trainer.max_steps",
        str(steps),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks",
        json.dumps([{"class_path": "benchmarks.gpu_check.step_times.StepTimes"}]),
        "--step_checkpoint.every_n_train_steps",
        "100000",
        "--trainer.log_every_n_steps",
        "50",
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)
    ends = json.loads((run_dir / "step_times.json").read_text())["step_end_s"]
    return batch * (len(ends) - FIT_SKIP_STEPS) / (ends[-1] - ends[FIT_SKIP_STEPS - 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--fit-recipes", nargs="*", default=None, help="recipes to also `fit` (default: all)")
    ap.add_argument("--paths", nargs="*", default=["cpu", "gpu"], choices=["cpu", "gpu"])
    ap.add_argument("--batch", type=int, default=None, help="override every recipe's batch")
    ap.add_argument("--workers", type=int, default=None, help="override every recipe's loader workers")
    ap.add_argument("--images", type=int, default=1024, help="images in the shards (cycled)")
    ap.add_argument("--loader-batches", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40, help="fit steps (the first 5 not timed)")
    ap.add_argument("--reps", type=int, default=10, help="timed bare steps")
    ap.add_argument("--fit-timeout", type=float, default=240)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of every part (default: 1 on the CPU, where more spin against other jobs)",
    )
    ap.add_argument("--out", type=Path, default=Path("runs/bench_pipeline"), help="shards and fit runs")
    add_results_option(ap, "input_pipeline.json")
    args = ap.parse_args()
    args.results = results_file(args, "input_pipeline.json")  # before any measuring
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    args.out.mkdir(parents=True, exist_ok=True)
    fit_recipes = args.recipes if args.fit_recipes is None else args.fit_recipes
    rows = []
    print(f"torch {torch.__version__}, {device}, {os.cpu_count()} CPUs; images/s (ratio to the bare step)", flush=True)
    for name in args.recipes:
        recipe, px, on_cuda, on_cpu = RECIPES[name]
        batch, workers = on_cuda if device.type == "cuda" else on_cpu
        batch, workers = args.batch or batch, args.workers if args.workers is not None else workers
        shards = write_jpeg_shards(args.out, args.images, px)
        bare = bare_images_per_s(recipe_args(recipe, shards, batch, workers, "cpu", device), device, args.reps)
        row = {"recipe": name, "batch": batch, "workers": workers, "bare": bare}
        print(f"{name}: batch {batch}, {workers} workers, bare step {bare:.1f} img/s", flush=True)
        for path in args.paths:
            run_args = recipe_args(recipe, shards, batch, workers, path, device)
            loader = loader_images_per_s(run_args, device, args.loader_batches)
            row[f"loader_{path}"] = loader
            line = f"  {path} path: loader alone {loader:8.1f} ({loader / bare:.2f})"
            if name in fit_recipes:
                fit = fit_images_per_s(
                    run_args, batch, args.steps, args.out / f"fit_{name}_{path}", args.fit_timeout, threads
                )
                row[f"fit_{path}"] = fit
                line += f" | fit {fit:8.1f} ({fit / bare:.2f}; target >= 0.90)"
            print(line, flush=True)
        rows.append(row)
        write_results(args.results, "input_pipeline.json", {"device": str(device), "rows": rows})


if __name__ == "__main__":
    main()
