"""One prepared check of the CUDA path: GAug paths equal, end-to-end runs, LocAtViT-S vs ViT-S cost.

    python benchmarks/gpu_check.py                       # one CUDA GPU, at most 8 minutes
    python benchmarks/gpu_check.py --out DIR --deadline 420 --only equivalence e2e
    python benchmarks/gpu_check.py --dry-run             # every case at toy size on the CPU (tests/test_gpu_check.py)

Everything lands in ``--out`` (default ``gpu_check-<UTC time>``), written as it goes, so a run cut
short still leaves its evidence: ``results.json`` (machine: GPU model, driver, CUDA, torch, Triton
versions, git commit; every row; each section's budget and time) and ``table.md`` (the table
printed on stdout), rewritten after every row; ``equivalence-mask.log``, ``equivalence-flex.log``,
``speed.log`` (the full output of the child processes); ``e2e/`` (each ``locatdino --debug``
command's log, run folder, ``step_times.json`` and Hummingbird ``results.json``).

Sections, in this order, each with a budget (default 200 / 190 / 90 s, scaled to ``--deadline``;
time a section leaves unused passes to the next; a case still running at its section's end is
killed and marked TIMEOUT, the cases after it are listed as not run):

- ``equivalence`` (child processes, see ``gpu_check_cases.py``): a 2-block LocAtViT-S forward
  and backward through the materialised-mask path, then the flex path, each in its own process
  (restarted after a case that faults the device), fp32 (TF32 off) and bf16, at 224 / 96 / 448 px
  with a class token and with class + 4 registers, against the CPU path; per-tensor relative
  Frobenius error, bf16 judged against the CPU path's own bf16 error.
- ``e2e``: ``locatdino fit`` of configs/dino_vits16.yaml (``--trainer.strategy ddp
  --trainer.devices 1``: NCCL initialises) and configs/dino_locatvits16.yaml for 50 steps on
  built-in scenes (bf16-mixed); images/s from the steps after the fifth. Then ``locatdino
  hbird`` of both teachers at 448 px on the GPU (bf16; torch k-NN without faiss-gpu), and the
  same run on the CPU in fp32 with FAISS (same seed: same memory views): Δ mIoU ≤ 0.1.
- ``speed`` (one child process): ViT-S, LocAtViT-S (auto: flex) and LocAtViT-S with the
  materialised mask, bf16: a DINO step (batch 64 = 2 × 224 + 8 × 96 px crops, 65 536
  prototypes), eval forward at 448 and 1024 px (batch 16); the first call (compilation) apart
  from the median of 10 calls after 3 warm-up calls; peak memory; ratios over ViT-S against the
  targets (step ≤ 1.10×, eval 448 ≤ 1.2×, eval 1024 ≤ 1.3×, peak memory ≤ 1.10×).

Exit status: 1 if a correctness check FAILs, 3 if none failed but cases hit the deadline
(TIMEOUT: rerun them with ``--only``), 2 if only speed / memory targets are MISSed, 0 otherwise.
The budgets are a plan, not a measurement: compile times of the flex kernels on a GPU are unknown
until the first run, so the most telling cases go first in each section.

``--dry-run`` builds and runs every case with toy models on the CPU (FlexAttention's reference
backward, which the CPU API refuses: the guard is lifted for the dry run only), so the script
cannot rot between GPU runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import timm
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from gpu_check_cases import SPEED_CASES, Row, case_title, equivalence_cases  # noqa: E402
from locatdino.output_files import atomic_write_text  # noqa: E402

SECTIONS = ("equivalence", "e2e", "speed")
BUDGET_S = {"equivalence": 200, "e2e": 190, "speed": 90}  # sums to the default deadline, 480 s
HBIRD_MAX_DELTA = 0.1
FIT_SKIP_STEPS = 5  # steps left out of the fit throughput (compilation, loader start-up)


# ------------------------------------------------------------------------------- child processes


def child_env(dry: bool) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
    if dry:
        env["OMP_NUM_THREADS"] = "1"
    return env


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a child started with ``start_new_session`` and everything it started (loader workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextlib.contextmanager
def child(cmd: list[str], **popen) -> Iterator[subprocess.Popen]:
    """A child in its own session (a deadline kills its whole group) that never outlives the
    check: also killed when the check stops early (Ctrl-C, an error)."""
    proc = subprocess.Popen(cmd, start_new_session=True, cwd=ROOT, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            kill_group(proc)


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_cases(command: list[str], cases: list[str], log: Path, until: float, section: str,
              title: Callable[[str], str] = case_title, env: dict[str, str] | None = None) -> Iterator[Row]:
    """Rows of ``cases`` run by ``command + cases`` (the ``@@`` protocol of ``gpu_check_cases.py``),
    its output appended to ``log``. A child that dies inside a case fails that case and a fresh
    one takes the rest; at ``until`` (``time.monotonic()``) the child is killed, the running case
    is a TIMEOUT row and the others are listed as not run."""
    remaining = list(cases)
    with log.open("a") as log_file:
        while remaining:
            if time.monotonic() >= until:
                yield from timed_out(section, remaining, None, title)
                return
            with child([*command, *remaining], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env) as proc:
                lines: queue.Queue = queue.Queue()
                threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
                current = None
                while True:
                    try:
                        line = lines.get(timeout=max(0.0, until - time.monotonic()))
                    except queue.Empty:
                        kill_group(proc)
                        log_file.write(f"gpu_check: killed at the section's deadline, in case {current}\n")
                        yield from timed_out(section, remaining, current, title)
                        return
                    if line is None:
                        break
                    log_file.write(line)
                    log_file.flush()
                    kind, _, payload = line.rstrip("\n").partition(" ")
                    if kind == "@@start":
                        current = payload
                    elif kind == "@@row":
                        yield Row(**json.loads(payload))
                    elif kind == "@@done":
                        remaining.remove(payload)
                        current = None
                code = proc.wait()
            if current is not None:  # died inside a case: that case fails, a fresh process goes on
                yield Row(section, title(current), f"child process died in this case (exit {code}); see {log.name}",
                          "no error", "FAIL")
                remaining.remove(current)
            elif remaining and code != 3:  # died before its first case (3: asked for a fresh process)
                for case in remaining:
                    yield Row(section, title(case), f"not run: child process exited {code}; see {log.name}",
                              "no error", "FAIL")
                return


def timed_out(section: str, remaining: list[str], current: str | None, title: Callable[[str], str]) -> Iterator[Row]:
    for case in remaining:
        value = "stopped at the section's deadline" if case == current else "not run: section deadline reached"
        yield Row(section, title(case), value, "within budget", "TIMEOUT")


def run_logged(cmd: list[str], log: Path, until: float, env: dict[str, str]) -> int | None:
    """Run ``cmd``, all its output into ``log``; its exit status, or None when killed at ``until``."""
    with log.open("w") as log_file:
        log_file.write(f"$ {' '.join(cmd)}\n")
        log_file.flush()
        if time.monotonic() >= until:
            log_file.write("gpu_check: not run, the section's deadline was reached\n")
            return None
        with child(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env) as proc:
            try:
                return proc.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                return None


# -------------------------------------------------------------------------------------------- e2e


@dataclass(frozen=True)
class E2E:
    """The end-to-end runs' sizes (GPU run or dry run)."""

    fit_configs: tuple[str, str]  # ViT (run with DDP), LocAtViT
    fit_steps: int
    fit_batch: int
    hbird_models: tuple[str, str]  # the backbones of those recipes
    fit_args: list[str] = field(default_factory=list)
    hbird_args: list[str] = field(default_factory=list)
    hbird_device_args: list[str] = field(default_factory=list)  # the run compared with the CPU fp32 one


FULL_E2E = E2E(
    fit_configs=("configs/dino_vits16.yaml", "configs/dino_locatvits16.yaml"), fit_steps=50, fit_batch=64,
    hbird_models=("vit_small_patch16_224", "locatvit_small"),
    fit_args=["--trainer.devices", "1", "--trainer.precision", "bf16-mixed",
              "--data.init_args.synthetic", "512", "--data.init_args.synthetic_size", "256",
              "--data.init_args.batches_per_epoch", "50", "--data.init_args.num_workers", "12"],
    hbird_args=["--num-train", "128", "--num-val", "64", "--scene-size", "448", "--input-size", "448",
                "--index", "Flat", "--batch-size", "16", "--workers", "8"],  # full batches only: one compile
    hbird_device_args=["--device", "cuda", "--precision", "bf16"],
)
DRY_E2E = E2E(
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
                "--k", "5", "--workers", "0", "--index", "Flat"],
    hbird_device_args=["--device", "cpu", "--precision", "fp32", "--knn-backend", "torch"],
)
HBIRD_CPU_ARGS = ["--device", "cpu", "--precision", "fp32", "--knn-backend", "faiss"]


def last_loss(run_dir: Path) -> float:
    """The last logged train/loss of a fit (NaN if none)."""
    losses = [float(row["train/loss"]) for path in run_dir.glob("logs/version_*/metrics.csv")
              for row in csv.DictReader(path.open()) if row.get("train/loss")]
    return losses[-1] if losses else math.nan


def steady_images_per_s(run_dir: Path, batch: int) -> tuple[float, int]:
    """Images/s over the steps after the first ``FIT_SKIP_STEPS`` (fewer in a short run), and how
    many steps that is."""
    ends = json.loads((run_dir / "step_times.json").read_text())["step_end_s"]
    skip = min(FIT_SKIP_STEPS, len(ends) - 2)
    steps = len(ends) - 1 - skip
    return batch * steps / (ends[-1] - ends[skip]), steps


def e2e(sizes: E2E, out: Path, until: float, dry: bool) -> Iterator[Row]:
    out.mkdir(exist_ok=True)
    env, steps = child_env(dry), sizes.fit_steps
    locatdino = [sys.executable, "-m", "locatdino", "--debug"]
    ckpts = []
    for config, strategy in zip(sizes.fit_configs, ("ddp", "auto")):
        name = Path(config).stem
        run_dir, case = out / f"fit-{name}", f"locatdino fit {name}, {steps} steps, strategy {strategy}"
        cmd = [*locatdino, "fit", "--config", str(ROOT / config), *sizes.fit_args, "--trainer.strategy", strategy,
               "--trainer.max_steps", str(steps), "--data.init_args.batch_size", str(sizes.fit_batch),
               "--data.init_args.train_urls", str(out / "scenes"), "--trainer.default_root_dir", str(run_dir),
               "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1",
               "--step_checkpoint.every_n_train_steps", str(steps),
               "--trainer.callbacks+=fit_step_times.StepTimes"]
        start = time.monotonic()
        code = run_logged(cmd, out / f"fit-{name}.log", until, env)
        wall = time.monotonic() - start
        if code != 0:
            yield command_failed("e2e", case, code, f"fit-{name}.log")
            continue
        loss = last_loss(run_dir)
        ips, timed_steps = steady_images_per_s(run_dir, sizes.fit_batch)
        backend = re.search(r"distributed_backend=(\w+)", (out / f"fit-{name}.log").read_text())
        yield Row("e2e", case, f"loss {loss:.3f}, {ips:.1f} img/s over the last {timed_steps} steps, "
                  f"wall {wall:.0f} s" + (f", {backend[1]} initialised" if backend else ""),
                  "finite loss", "PASS" if math.isfinite(loss) else "FAIL")
        ckpts.append(str(run_dir / "checkpoints" / "last.ckpt"))
    if len(ckpts) < 2:
        yield Row("e2e", "locatdino hbird", "not run: a fit failed", "both teachers", "FAIL")
        return
    models = [arg for name, ckpt in zip(sizes.hbird_models, ckpts) for arg in ("--model", name, "--checkpoint", ckpt)]
    results = {}
    for run, device_args in (("device", sizes.hbird_device_args), ("cpu-fp32", HBIRD_CPU_ARGS)):
        cmd = [*locatdino, "hbird", *models, *sizes.hbird_args, *device_args, "--dataset", "scenes", "--seed", "0",
               "--no-progress", "--out", str(out / f"hbird-{run}")]
        code = run_logged(cmd, out / f"hbird-{run}.log", until, env)
        if code != 0:
            yield command_failed("e2e", f"locatdino hbird, {run}", code, f"hbird-{run}.log")
        results[run] = {r["model"]["name"]: r for r in map(json.loads, map(Path.read_text,
                                                                          (out / f"hbird-{run}").glob("*/results.json")))}
    for name in sizes.hbird_models:
        yield hbird_row(name, results["device"].get(name), results["cpu-fp32"].get(name))


def hbird_row(name: str, device: dict | None, cpu: dict | None) -> Row:
    if device is None:
        return Row("e2e", f"locatdino hbird {name}", "no results.json", "Δ mIoU <= 0.1 vs CPU fp32", "FAIL")
    t = device["timings"]
    images = device["num_train"] * device["config"]["aug_epochs"] + device["num_val"]
    value = (f"mIoU {device['miou']:.2f}, encoder {images / t['features']:.0f} img/s, search {t.get('search', 0):.1f} s"
             f", total {t['total']:.0f} s")
    row = Row("e2e", f"locatdino hbird {name} {device['config']['input_size']} px", value,
              f"Δ mIoU <= {HBIRD_MAX_DELTA} vs CPU fp32", "FAIL")
    if cpu is not None:
        delta = abs(device["miou"] - cpu["miou"])
        row.value += f"; CPU fp32 {cpu['miou']:.2f} (Δ {delta:.2f})"
        row.status = "PASS" if delta <= HBIRD_MAX_DELTA else "FAIL"
    else:
        row.value += "; no CPU fp32 result to compare"
    return row


def command_failed(section: str, case: str, code: int | None, log: str) -> Row:
    if code is None:
        return Row(section, case, f"killed at the section's deadline; see e2e/{log}", "within budget", "TIMEOUT")
    return Row(section, case, f"exit {code}; see e2e/{log}", "exit 0", "FAIL")


# ------------------------------------------------------------------------------------------- main


def environment(dry: bool) -> dict:
    """What ran: versions, the GPU and its driver, the checkout."""
    def command(*cmd: str) -> str | None:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {"utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "dry_run": dry, "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "triton": triton_version, "timm": timm.__version__,
           "cpu_count": os.cpu_count(), "git_commit": command("git", "rev-parse", "HEAD")}
    if not dry:
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}", "cudnn": torch.backends.cudnn.version(),
                "driver": command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")}
    return env


class Report:
    """The rows so far, printed and rewritten to ``results.json`` and ``table.md`` after each one."""

    HEADER = ("section", "case", "value", "target", "status")

    def __init__(self, out: Path, env: dict):
        self.out, self.env = out, env
        self.rows: list[Row] = []
        self.sections: dict[str, dict] = {}
        print(self.line(self.HEADER), flush=True)

    @staticmethod
    def line(cells: tuple[str, ...]) -> str:
        widths = (11, 46, 60, 16, 7)
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(self.line((row.section, row.case, row.value, row.target, row.status)), flush=True)
        self.save()

    def save(self) -> None:
        atomic_write_text(self.out / "results.json", json.dumps(
            {"environment": self.env, "sections": self.sections, "rows": [asdict(r) for r in self.rows],
             "exit_status": self.exit_status()}, indent=1))
        lines = [self.line(self.HEADER), "|" + "---|" * 5]
        lines += [self.line((r.section, r.case, r.value, r.target, r.status)) for r in self.rows]
        atomic_write_text(self.out / "table.md", "\n".join(lines) + "\n")

    def exit_status(self) -> int:
        statuses = {r.status for r in self.rows}
        return 1 if "FAIL" in statuses else 3 if "TIMEOUT" in statuses else 2 if "MISS" in statuses else 0


def section_rows(section: str, out: Path, until: float, dry: bool) -> Iterator[Row]:
    env = child_env(dry)
    cases_cmd = [sys.executable, str(HERE / "gpu_check_cases.py"), section, *(["--dry-run"] if dry else [])]
    if section == "equivalence":
        for path in ("mask", "flex"):
            yield from run_cases(cases_cmd, equivalence_cases(path), out / f"equivalence-{path}.log", until,
                                 section, env=env)
    elif section == "speed":
        yield from run_cases(cases_cmd, SPEED_CASES, out / "speed.log", until, section, env=env)
    else:
        yield from e2e(DRY_E2E if dry else FULL_E2E, out / "e2e", until, dry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (no GPU needed)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default gpu_check-<UTC time>)")
    parser.add_argument("--deadline", type=float, default=sum(BUDGET_S.values()),
                        help="seconds for the whole check; section budgets are scaled to it")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 1
    out = args.out or Path(f"gpu_check-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}")
    if out.exists() and any(out.iterdir()):
        print(f"gpu_check: --out {out} is not empty; give a new folder", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out, environment(args.dry_run))
    scale = args.deadline / sum(BUDGET_S[s] for s in args.only)
    start = end = time.monotonic()
    for section in args.only:
        end += BUDGET_S[section] * scale  # a section's unused time passes to the next
        began = time.monotonic()
        for row in section_rows(section, out, end, args.dry_run):
            report.add(row)
        report.sections[section] = {"budget_s": round(end - began, 1), "took_s": round(time.monotonic() - began, 1)}
        report.save()
    print(f"gpu_check: {time.monotonic() - start:.0f} s; results in {out}", file=sys.stderr)
    return report.exit_status()


if __name__ == "__main__":
    sys.exit(main())
