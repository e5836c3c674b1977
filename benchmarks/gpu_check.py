"""One prepared check of the CUDA path: GAug paths equal, LocAtViT-S vs ViT-S cost, end-to-end runs.

    python benchmarks/gpu_check.py              # one CUDA GPU, about 8 minutes; table on stdout
    python benchmarks/gpu_check.py --dry-run    # every case at toy size on the CPU (tests/test_gpu_check.py)
    python benchmarks/gpu_check.py --only equivalence speed   # a subset of the sections

Sections (each row of the table: value, target, PASS / FAIL / MISS):

- ``equivalence``: a 2-block LocAtViT-S (real width and heads, GAug weights drawn large so the
  bias matters), forward and backward (output, input and every parameter gradient) on CUDA
  through the flex and the materialised-mask paths, fp32 (TF32 off) and bf16 autocast, against
  the CPU path (fused separable kernel, fp32) on the same weights and inputs, at 224, 96 and
  448 px, with a class token and with class token + 4 registers. Error: max |a − b| / max |b|
  per tensor, worst tensor; limits 1e-4 (fp32) and 5e-2 (bf16 against the fp32 reference).
- ``speed``: ViT-S, LocAtViT-S (auto: flex) and LocAtViT-S with the materialised mask (the
  comparison row), bf16 autocast, one model resident at a time: a DINO step (teacher forward,
  student forward, loss, backward, per-tensor clipping, AdamW, EMA; batch 64 = 2 × 224 px +
  8 × 96 px crops per image, 65 536 prototypes), eval forward at 448 and 1024 px (batch 8).
  Median time after warm-up (the flex kernels compile in it), peak CUDA memory of each, ratios
  over ViT-S against the targets (step ≤ 1.10×, eval 448 ≤ 1.2×, eval 1024 ≤ 1.3×, peak
  memory ≤ 1.10×).
- ``e2e``: ``locatdino fit`` of configs/dino_vits16.yaml and configs/dino_locatvits16.yaml for 50
  steps on built-in scenes (bf16-mixed, one GPU), then ``locatdino hbird`` of both teachers at
  448 px on the GPU (k-NN with torch when faiss-gpu is absent); images/s from wall time (fit,
  start-up included) and from the run's own phase timings (hbird).

Exit status: 1 if a correctness check FAILs (paths differ, a command fails, a loss is not
finite), 2 if only speed / memory targets are MISSed, 0 otherwise. ``--dry-run`` builds and runs
every case with toy models on the CPU (the flex backward through FlexAttention's reference dense
backward, which the CPU API refuses: the guard is lifted for the dry run only), so the script
cannot rot between GPU runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from locatdino.models import GAugAttention, GaussianLocalityBias  # noqa: E402  (registers locatvit_*)
from locatdino.ssl import DINOModule, clip_grad_per_tensor_, update_teacher  # noqa: E402

SECTIONS = ("equivalence", "speed", "e2e")
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
COMMAND_TIMEOUT_S = 600
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


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
    reps: int
    fit_configs: tuple[str, str]  # ViT, LocAtViT recipes
    fit_steps: int
    fit_batch: int
    hbird_models: tuple[str, str]  # the backbones of those recipes
    fit_args: list[str] = field(default_factory=list)
    hbird_args: list[str] = field(default_factory=list)


FULL = Sizes(
    equiv_model=dict(depth=2), equiv_px=(224, 96, 448), equiv_batch=2,
    speed_model={}, head=dict(out_dim=65536), dino_batch=64, crops_px=(224, 96), local_crops=8,
    eval_px=(448, 1024), eval_batch=8, reps=10,
    fit_configs=("configs/dino_vits16.yaml", "configs/dino_locatvits16.yaml"), fit_steps=50, fit_batch=64,
    hbird_models=("vit_small_patch16_224", "locatvit_small"),
    fit_args=["--trainer.devices", "1", "--trainer.strategy", "auto", "--trainer.precision", "bf16-mixed",
              "--data.init_args.synthetic", "512", "--data.init_args.synthetic_size", "256",
              "--data.init_args.batches_per_epoch", "50", "--data.init_args.num_workers", "12"],
    hbird_args=["--num-train", "300", "--num-val", "100", "--scene-size", "448", "--input-size", "448",
                "--precision", "bf16", "--index", "Flat", "--batch-size", "16", "--device", "cuda"],
)
DRY = Sizes(
    equiv_model=dict(img_size=64, depth=1, embed_dim=64, num_heads=2), equiv_px=(64, 32, 96), equiv_batch=1,
    speed_model=dict(img_size=32, depth=1, embed_dim=64, num_heads=2),
    head=dict(out_dim=64, hidden_dim=32, bottleneck_dim=16), dino_batch=2, crops_px=(32, 16), local_crops=2,
    eval_px=(48, 64), eval_batch=1, reps=1,
    fit_configs=("configs/tiny_vit.yaml", "configs/tiny_locatvit.yaml"), fit_steps=2, fit_batch=2,
    hbird_models=("vit_tiny_patch16_224", "locatvit_tiny"),
    fit_args=["--trainer.accelerator", "cpu", "--trainer.precision", "bf16-mixed",
              "--model.backbone_kwargs", json.dumps(dict(img_size=32)),
              "--model.out_dim", "64", "--model.hidden_dim", "32", "--model.bottleneck_dim", "16",
              "--data.init_args.synthetic", "8", "--data.init_args.synthetic_size", "48",
              "--data.init_args.num_workers", "0",
              "--data.init_args.multicrop", json.dumps({"global_crop_size": 32, "local_crop_size": 16,
                                                        "num_local_crops": 2})],
    hbird_args=["--num-train", "4", "--num-val", "2", "--scene-size", "32", "--input-size", "32",
                "--k", "5", "--workers", "0", "--device", "cpu", "--knn-backend", "torch"],
)
LABELS = {"equiv": (224, 96, 448), "eval": (448, 1024)}


@dataclass
class Row:
    section: str
    case: str
    value: str
    target: str = ""
    status: str = "PASS"  # PASS | FAIL (correctness) | MISS (speed / memory target) | n/a (dry run)


# ---------------------------------------------------------------------------------------- helpers


def set_gaug_path(model: torch.nn.Module, path: str) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, GAugAttention):
            module.gaug_path = path
    return model


@contextlib.contextmanager
def cpu_flex_backward(enabled: bool) -> Iterator[None]:
    """Dry run only: let FlexAttention's reference dense backward run on the CPU."""
    import torch.nn.attention.flex_attention as flex_api

    guard = flex_api._validate_device
    if enabled:
        flex_api._validate_device = lambda *tensors: None
    try:
        yield
    finally:
        flex_api._validate_device = guard


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], None], reps: int, device: torch.device) -> tuple[float, float | None]:
    """Median seconds of ``fn`` over ``reps`` calls after two warm-up calls (compilation), and the
    peak CUDA memory in MiB of one more call (None on the CPU)."""
    for _ in range(2):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    return statistics.median(times), peak


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ equivalence


def equivalence_model(sizes: Sizes, reg_tokens: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("locatvit_small", num_classes=0, reg_tokens=reg_tokens, **sizes.equiv_model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, GaussianLocalityBias):
                for p in module.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.train()


def forward_backward(model, x, grad_out, device, dtype, path) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient, fp32 on the CPU."""
    model = set_gaug_path(copy.deepcopy(model).to(device), path)
    x = x.to(device).requires_grad_(True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = model.forward_features(x)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, [x, *params], grad_out.to(device, out.dtype), allow_unused=True)
    return [t.detach().float().cpu() for t in (out, *grads) if t is not None]


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    assert len(got) == len(want), (len(got), len(want))
    return max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(got, want))


def equivalence(sizes: Sizes, device: torch.device, dry: bool) -> Iterator[Row]:
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
    try:
        for reg_tokens, prefix in ((0, "class token"), (4, "class + 4 registers")):
            model = equivalence_model(sizes, reg_tokens)
            for px, label in zip(sizes.equiv_px, LABELS["equiv"]):
                g = torch.Generator().manual_seed(px)
                x = torch.randn(sizes.equiv_batch, 3, px, px, generator=g)
                n = model.num_prefix_tokens + (px // 16) ** 2
                grad_out = torch.randn(sizes.equiv_batch, n, model.embed_dim, generator=g)
                want = forward_backward(model, x, grad_out, torch.device("cpu"), torch.float32, "separable")
                for path in ("flex", "mask"):
                    for dtype in (torch.float32, torch.bfloat16):
                        case, limit = f"{path} {DTYPE_NAMES[dtype]} {label} px, {prefix}", TOLERANCE[dtype]
                        try:
                            with cpu_flex_backward(dry and path == "flex"):
                                err = relative_error(forward_backward(model, x, grad_out, device, dtype, path), want)
                        except Exception as exc:  # noqa: BLE001  (one failed case must not hide the others)
                            yield error_row("equivalence", case, exc)
                            continue
                        yield Row("equivalence", case, f"{err:.1e}", f"<= {limit:.0e}",
                                  "PASS" if err <= limit else "FAIL")
            release(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


# ------------------------------------------------------------------------------------------ speed

SPEED_MODELS = {  # label: (timm name, GAug path)
    "ViT-S": ("vit_small_patch16_224", "auto"),
    "LocAtViT-S": ("locatvit_small", "auto"),
    "LocAtViT-S, materialised bias": ("locatvit_small", "mask"),
}


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


def speed(sizes: Sizes, device: torch.device, dry: bool) -> Iterator[Row]:
    cases = {"DINO step": lambda name, path: dino_step(sizes, name, path, device)}
    for px, label in zip(sizes.eval_px, LABELS["eval"]):
        cases[f"eval {label} px"] = lambda name, path, px=px: eval_forward(sizes, name, path, px, device)
    targets = {"DINO step": 1.10, "eval 448 px": 1.2, "eval 1024 px": 1.3}

    def judged(ratio: float, limit: float) -> str:  # toy CPU timings of a dry run prove nothing
        return "n/a" if dry else "MISS" if ratio > limit else "PASS"

    for case, make in cases.items():
        base_time = base_peak = None
        for label, (name, path) in SPEED_MODELS.items():
            try:
                seconds, peak = timed(make(name, path), sizes.reps, device)
            except Exception as exc:  # noqa: BLE001  (e.g. out of memory: report, go on)
                yield error_row("speed", f"{case}: {label}", exc)
                continue
            finally:
                release(device)
            if label == "ViT-S":
                base_time, base_peak = seconds, peak
            if base_time is None:
                yield Row("speed", f"{case}: {label}", f"{seconds * 1e3:.1f} ms (no ViT-S baseline)")
                continue
            ratio = seconds / base_time
            row = Row("speed", f"{case}: {label}", f"{seconds * 1e3:.1f} ms ({ratio:.2f}x)")
            if label == "LocAtViT-S":
                row.target, row.status = f"time <= {targets[case]:.2f}x", judged(ratio, targets[case])
            elif label != "ViT-S":
                row.target = "comparison"
            yield row
            if peak is not None:
                mem_ratio = peak / base_peak
                row = Row("speed", f"{case}: {label}, peak memory", f"{peak:.0f} MiB ({mem_ratio:.2f}x)")
                if label == "LocAtViT-S":
                    row.target, row.status = "<= 1.10x", judged(mem_ratio, 1.10)
                yield row


# -------------------------------------------------------------------------------------------- e2e


def locatdino(args: list[str], cwd: Path, dry: bool) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if dry:
        env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "locatdino", *args]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a hung run (data loader, collective) becomes a FAIL row
        proc = subprocess.CompletedProcess(cmd, -1, "", f"killed after {COMMAND_TIMEOUT_S} s")
    return proc, time.perf_counter() - start


def failed(proc: subprocess.CompletedProcess) -> str:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"exit {proc.returncode}: {tail[0][:80]}"


def last_loss(run_dir: Path) -> float:
    """The last logged train/loss of a fit (NaN if none)."""
    import csv

    losses = [float(row["train/loss"]) for path in run_dir.glob("logs/version_*/metrics.csv")
              for row in csv.DictReader(path.open()) if row.get("train/loss")]
    return losses[-1] if losses else math.nan


def e2e(sizes: Sizes, dry: bool) -> Iterator[Row]:
    steps = sizes.fit_steps
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        tmp = Path(tmp)
        ckpts = []
        for config in sizes.fit_configs:
            run_dir = tmp / Path(config).stem
            args = ["fit", "--config", str(ROOT / config), *sizes.fit_args, "--trainer.max_steps", str(steps),
                    "--data.init_args.batch_size", str(sizes.fit_batch),
                    "--data.init_args.train_urls", str(tmp / "scenes"), "--trainer.default_root_dir", str(run_dir),
                    "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
                    "--step_checkpoint.every_n_train_steps", str(steps)]
            proc, wall = locatdino(args, ROOT, dry)
            case = f"locatdino fit {Path(config).stem}, {steps} steps"
            if proc.returncode != 0:
                yield Row("e2e", case, failed(proc), "exit 0", "FAIL")
                continue
            loss = last_loss(run_dir)
            images = steps * sizes.fit_batch
            yield Row("e2e", case, f"loss {loss:.3f}, {images / wall:.1f} img/s incl. start-up ({wall:.0f} s)",
                      "finite loss", "PASS" if math.isfinite(loss) else "FAIL")
            ckpts.append(str(run_dir / "checkpoints" / "last.ckpt"))
        if len(ckpts) == 2:
            models = [arg for name, ckpt in zip(sizes.hbird_models, ckpts)
                      for arg in ("--model", name, "--checkpoint", ckpt)]
            out = tmp / "hbird"
            proc, wall = locatdino(["hbird", *models, *sizes.hbird_args, "--dataset", "scenes", "--no-progress",
                                    "--out", str(out)], ROOT, dry)
            if proc.returncode != 0:
                yield Row("e2e", "locatdino hbird", failed(proc), "exit 0", "FAIL")
            for path in sorted(out.glob("*/results.json")):
                result = json.loads(path.read_text())
                t = result["timings"]
                images = result["num_train"] * result["config"]["aug_epochs"] + result["num_val"]
                ok = 0 <= result["miou"] <= 100
                yield Row("e2e", f"locatdino hbird {result['model']['name']} {result['config']['input_size']} px",
                          f"mIoU {result['miou']:.1f}, encoder {images / t['features']:.0f} img/s, "
                          f"search {t.get('search', 0):.1f} s, total {t['total']:.0f} s",
                          "mIoU in [0, 100]", "PASS" if ok else "FAIL")


# ------------------------------------------------------------------------------------------- main


def error_row(section: str, case: str, exc: Exception) -> Row:
    """A FAIL row naming the error; the traceback goes to stderr for the diagnosis."""
    traceback.print_exception(exc, file=sys.stderr)
    first = (str(exc).strip().splitlines() or [""])[0]
    return Row(section, case, f"{type(exc).__name__}: {first}"[:90], "no error", "FAIL")


def print_row(r: Row) -> None:
    cells = (r.section.ljust(11), r.case.ljust(46), r.value.ljust(54), r.target.ljust(16), r.status)
    print("| " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (no GPU needed)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 1
    sizes, device = (DRY, torch.device("cpu")) if args.dry_run else (FULL, torch.device("cuda"))
    if args.dry_run:  # the eager (unfused) FlexAttention is the point of a CPU dry run
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
    where = "CPU dry run" if args.dry_run else torch.cuda.get_device_name(device)
    print(f"gpu_check: torch {torch.__version__}, timm {timm.__version__}, {where}", flush=True)
    runs = {"equivalence": lambda: equivalence(sizes, device, args.dry_run),
            "speed": lambda: speed(sizes, device, args.dry_run), "e2e": lambda: e2e(sizes, args.dry_run)}
    statuses = set()
    for section in args.only:
        start = time.perf_counter()
        for row in runs[section]():  # printed as they come: a run cut short still shows its rows
            print_row(row)
            statuses.add(row.status)
        print(f"gpu_check: {section} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return 1 if "FAIL" in statuses else 2 if "MISS" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
