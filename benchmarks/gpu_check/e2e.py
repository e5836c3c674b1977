"""The ``e2e`` section of ``benchmarks/gpu_check/``: the ``locatdino`` commands end to end.

``locatdino fit`` of configs/dino_small_ddp.yaml with its ViT-S/16 (``--trainer.strategy ddp --trainer.devices 1``:
NCCL initialises) and with ``--model.backbone locatvit_small_patch16_224`` for 30 steps on built-in scenes (bf16-mixed);
images/s from the steps after the fifth. Then ``locatdino hbird`` of both teachers at 224 px
(64 memory / 32 query images, full batches of 16: one compile per model) on the GPU (bf16; torch
k-NN without faiss-gpu), and the same run on the CPU in fp32 with FAISS (same seed: same memory
views): Δ mIoU ≤ 0.1 per model.

Everything large stays out of ``--out``: the scenes' shards and the fits' run folders (their
checkpoints are hundreds of MB) live in a scratch folder that is deleted at the end; ``--out``
gets each command's log, the fits' metrics, config, ``step_times.json`` and curves (everything
of the run folder but checkpoints) and Hummingbird's results.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpu_check.children import child_env, log_tail, run_logged
from benchmarks.gpu_check.common import ROOT, Row

HBIRD_MAX_DELTA = 0.1
FIT_SKIP_STEPS = 5  # steps left out of the fit throughput (compilation, loader start-up)


@dataclass(frozen=True)
class E2E:
    """The end-to-end runs' sizes (GPU run or dry run)."""

    fit_config: str  # the recipe both backbones train with
    fit_steps: int
    fit_batch: int
    hbird_models: tuple[str, str]  # its --model.backbone: ViT (run with DDP), LocAtViT
    fit_args: list[str] = field(default_factory=list)
    hbird_args: list[str] = field(default_factory=list)
    hbird_device_args: list[str] = field(default_factory=list)  # the run compared with the CPU fp32 one


FULL_E2E = E2E(
    fit_config="configs/dino_small_ddp.yaml",
    fit_steps=30,
    fit_batch=64,
    hbird_models=("vit_small_patch16_224", "locatvit_small_patch16_224"),
    fit_args=[
        "--trainer.devices",
        "1",
        "--trainer.precision",
        "bf16-mixed",
        "--data.init_args.synthetic",
        "256",
        "--data.init_args.synthetic_size",
        "256",
        "--data.init_args.batches_per_epoch",
        "30",
        "--data.init_args.num_workers",
        "12",
    ],
    hbird_args=[
        "--num-train",
        "64",
        "--num-val",
        "32",
        "--scene-size",
        "224",
        "--input-size",
        "224",
        "--index",
        "Flat",
        "--batch-size",
        "16",
        "--workers",
        "8",
    ],  # full batches only: one compile
    hbird_device_args=["--device", "cuda", "--precision", "bf16"],
)
DRY_E2E = E2E(
    fit_config="configs/dino_tiny_cpu.yaml",
    fit_steps=2,
    fit_batch=2,
    hbird_models=("vit_tiny_patch16_224", "locatvit_tiny_patch8_224"),
    fit_args=[
        "--trainer.accelerator",
        "cpu",
        "--trainer.precision",
        "bf16-mixed",
        "--model.backbone_kwargs",
        json.dumps(dict(img_size=32)),
        "--model.out_dim",
        "64",
        "--model.hidden_dim",
        "32",
        "--model.bottleneck_dim",
        "16",
        "--data.init_args.synthetic",
        "8",
        "--data.init_args.synthetic_size",
        "48",
        "--data.init_args.num_workers",
        "0",
        "--data.init_args.multicrop",
        json.dumps({"global_crop_size": 32, "local_crop_size": 16, "num_local_crops": 2}),
    ],
    hbird_args=[
        "--num-train",
        "4",
        "--num-val",
        "2",
        "--scene-size",
        "32",
        "--input-size",
        "32",
        "--k",
        "5",
        "--workers",
        "0",
        "--index",
        "Flat",
    ],
    hbird_device_args=["--device", "cpu", "--precision", "fp32", "--knn-backend", "torch"],
)
HBIRD_CPU_ARGS = ["--device", "cpu", "--precision", "fp32", "--knn-backend", "faiss"]


def last_loss(run_dir: Path) -> float:
    """The last logged train/loss of a fit (NaN if none)."""
    losses = [
        float(row["train/loss"])
        for path in run_dir.glob("logs/version_*/metrics.csv")
        for row in csv.DictReader(path.open())
        if row.get("train/loss")
    ]
    return losses[-1] if losses else math.nan


def steady_images_per_s(run_dir: Path, batch: int) -> tuple[float, int]:
    """Images/s over the steps after the first ``FIT_SKIP_STEPS`` (fewer in a short run), and how
    many steps that is."""
    ends = json.loads((run_dir / "step_times.json").read_text())["step_end_s"]
    skip = min(FIT_SKIP_STEPS, len(ends) - 2)
    steps = len(ends) - 1 - skip
    return batch * steps / (ends[-1] - ends[skip]), steps


def keep_small_files(run_dir: Path, out: Path) -> None:
    """Copy a fit's run folder into ``out``, checkpoints left behind."""
    if run_dir.is_dir():
        shutil.copytree(run_dir, out, ignore=shutil.ignore_patterns("*.ckpt", "*.ckpt.tmp*"), dirs_exist_ok=True)


def command_failed(section: str, case: str, code: int | None, log: Path) -> Row:
    if code is None:
        return Row(
            section,
            case,
            f"killed at the section's deadline; see e2e/{log.name}",
            "within budget",
            "TIMEOUT",
            log_tail(log),
        )
    return Row(section, case, f"exit {code}; see e2e/{log.name}", "exit 0", "FAIL", log_tail(log))


def fit(
    sizes: E2E, backbone: str, strategy: str, out: Path, scratch: Path, until: float, dry: bool
) -> tuple[Row, Path | None]:
    """One ``locatdino fit`` run of the recipe with ``backbone`` in ``scratch``; its row and its checkpoint's path."""
    name, steps = f"{Path(sizes.fit_config).stem} {backbone}", sizes.fit_steps
    run_dir, case = scratch / f"fit-{backbone}", f"locatdino fit {name}, {steps} steps, strategy {strategy}"
    log = out / f"fit-{backbone}.log"
    cmd = [
        sys.executable,
        "-m",
        "locatdino",
        "--debug",
        "fit",
        "--config",
        str(ROOT / sizes.fit_config),
        "--model.backbone",
        backbone,
        *sizes.fit_args,
        "--trainer.strategy",
        strategy,
        "--trainer.max_steps",
        str(steps),
        "--data.init_args.batch_size",
        str(sizes.fit_batch),
        "--data.init_args.train_urls",
        str(scratch / "scenes"),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.log_every_n_steps",
        "1",
        "--step_checkpoint.every_n_train_steps",
        str(steps),
        "--trainer.callbacks+=benchmarks.gpu_check.step_times.StepTimes",
    ]
    start = time.monotonic()
    code = run_logged(cmd, log, until, child_env(dry))
    wall = time.monotonic() - start
    keep_small_files(run_dir, out / f"fit-{backbone}")
    if code != 0:
        return command_failed("e2e", case, code, log), None
    loss = last_loss(run_dir)
    ips, timed_steps = steady_images_per_s(run_dir, sizes.fit_batch)
    backend = re.search(r"distributed_backend=(\w+)", log.read_text())
    row = Row(
        "e2e",
        case,
        f"loss {loss:.3f}, {ips:.1f} img/s over the last {timed_steps} steps, wall {wall:.0f} s"
        + (f", {backend[1]} initialised" if backend else ""),
        "finite loss",
        "PASS" if math.isfinite(loss) else "FAIL",
    )
    return row, run_dir / "checkpoints" / "last.ckpt"


def e2e(sizes: E2E, out: Path, until: float, dry: bool) -> Iterator[Row]:
    out.mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check-e2e-"))
    try:
        ckpts = []
        for backbone, strategy in zip(sizes.hbird_models, ("ddp", "auto")):
            row, ckpt = fit(sizes, backbone, strategy, out, scratch, until, dry)
            yield row
            if ckpt is not None:
                ckpts.append(str(ckpt))
        if len(ckpts) < 2:
            yield Row("e2e", "locatdino hbird", "not run: a fit failed", "both teachers", "FAIL")
            return
        yield from hbird(sizes, ckpts, out, until, dry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def hbird(sizes: E2E, ckpts: list[str], out: Path, until: float, dry: bool) -> Iterator[Row]:
    """Both teachers on the device and on the CPU in fp32, same memory views; one row per model."""
    models = [arg for name, ckpt in zip(sizes.hbird_models, ckpts) for arg in ("--model", f"{name}:{ckpt}")]
    results = {}
    for run, device_args in (("device", sizes.hbird_device_args), ("cpu-fp32", HBIRD_CPU_ARGS)):
        cmd = [
            sys.executable,
            "-m",
            "locatdino",
            "--debug",
            "hbird",
            *models,
            *sizes.hbird_args,
            *device_args,
            "--dataset",
            "scenes",
            "--seed",
            "0",
            "--no-progress",
            "--out",
            str(out / f"hbird-{run}"),
        ]
        log = out / f"hbird-{run}.log"
        code = run_logged(cmd, log, until, child_env(dry))
        if code != 0:
            yield command_failed("e2e", f"locatdino hbird, {run}", code, log)
        written = out / f"hbird-{run}" / "results.json"  # one for all the models (locatdino.evaluation.results)
        records = json.loads(written.read_text())["models"] if written.is_file() else []
        results[run] = {r["model"]["name"]: r for r in records}
    for name in sizes.hbird_models:
        yield hbird_row(name, results["device"].get(name), results["cpu-fp32"].get(name))


def hbird_row(name: str, device: dict | None, cpu: dict | None) -> Row:
    if device is None:
        return Row("e2e", f"locatdino hbird {name}", "no results.json", "Δ mIoU <= 0.1 vs CPU fp32", "FAIL")
    t = device["timings"]
    images = device["num_train"] * device["config"]["aug_epochs"] + device["num_val"]
    value = (
        f"mIoU {device['miou']:.2f}, encoder {images / t['features']:.0f} img/s, search {t.get('search', 0):.1f} s"
        f", total {t['total']:.0f} s"
    )
    row = Row(
        "e2e",
        f"locatdino hbird {name} {device['config']['input_size']} px",
        value,
        f"Δ mIoU <= {HBIRD_MAX_DELTA} vs CPU fp32",
        "FAIL",
    )
    if cpu is not None:
        delta = abs(device["miou"] - cpu["miou"])
        row.value += f"; CPU fp32 {cpu['miou']:.2f} (Δ {delta:.2f}, CPU total {cpu['timings']['total']:.0f} s)"
        row.status = "PASS" if delta <= HBIRD_MAX_DELTA else "FAIL"
    else:
        row.value += "; no CPU fp32 result to compare"
    return row
