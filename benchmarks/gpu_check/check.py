"""One check of the CUDA path: FlexAttention's options, GAug paths equal, LocAtViT-S vs ViT-S
cost, the commands end to end.

    python -m benchmarks.gpu_check --out DIR                 # one CUDA GPU: 440 s, compiles included
    python -m benchmarks.gpu_check --out DIR --deadline 300 --only kernels speed
    python -m benchmarks.gpu_check --dry-run --out DIR       # every case at toy size on the CPU
                                                             # (tests/benchmarks/test_gpu_check.py)
    bash benchmarks/gpu_check/run.sh run                     # offline CUDA machine: wheels, this check, a tarball

Everything lands in ``--out``, written as it goes, so a run cut short still leaves its evidence,
and nothing large (a few hundred KB: no checkpoint, no shard; the last row checks it):
``results.json`` (machine: GPU model, driver, CUDA, torch, Triton versions, shared memory per
block, git commit; every row with its full ``detail``: whole error texts, both errors of a bf16
verdict, the kernel options chosen; each section's budget and time), ``table.md`` (the table
printed on stdout, then every row's detail), ``kernels.log``, ``equivalence.log``, ``speed.log``
(the full output of the child processes: the GAug loggers at DEBUG, tracebacks) and ``e2e/``
(each ``locatdino --debug`` command's log, the fits' metrics and ``step_times.json``,
Hummingbird's ``results.json``).

Sections, in this order, each with a budget (seconds, scaled to ``--deadline``; time a section
leaves unused passes to the next; a case still running at its section's end is killed and marked
TIMEOUT, the cases after it are listed as not run):

- ``kernels`` (60 s; ``speed.py``): FlexAttention with the GAug ``score_mod`` alone:
  what the option chooser takes, SDPA without a bias, each candidate option's compile, time and
  error (fp32 vs bf16 profiles at the same tiles).
- ``equivalence`` (120 s; ``cases.py``): a 2-block LocAtViT-S forward and backward
  through the flex, chunked and mask paths on the GPU in bf16 and in fp32 (TF32 off; mask: fp64), at
  224 / 96 / 448 px with a class token and with class + 4 registers, against the CPU path in
  fp64; bf16 judged against the CPU path's own bf16 error.
- ``speed`` (120 s; ``speed.py``): ViT-S vs LocAtViT-S (flex), its chunked and mask
  paths, bf16: DINO step, eval at 448 and 1024 px; targets over ViT-S: step ≤ 1.10×, eval 448 ≤
  1.2×, eval 1024 ≤ 1.3×, peak memory ≤ 1.10×.
- ``e2e`` (140 s; ``e2e.py``): ``locatdino fit`` of both recipes (DDP: NCCL),
  ``locatdino hbird`` of both teachers on the GPU and on the CPU in fp32.

Exit status: 1 if a correctness check FAILs, 3 if none failed but cases hit the deadline
(TIMEOUT: rerun them with ``--only``), 2 if only speed / memory targets are MISSed, 0 otherwise.
The budgets are a plan, not a measurement: the compile times of the flex kernels on a GPU were
never measured one by one, so each section runs its most telling cases first.

``--dry-run`` builds and runs every case with toy models on the CPU (FlexAttention's reference
backward, which the CPU API refuses: the guard is lifted for the dry run only), so the script
cannot rot between GPU runs; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpu_check.children import child_env, run_cases
from benchmarks.gpu_check.common import KERNEL_CASES, SPEED_CASES, Row, equivalence_cases
from benchmarks.gpu_check.e2e import DRY_E2E, FULL_E2E, e2e
from benchmarks.results_io import header
from locatdino.common.output_files import atomic_write_text

SECTIONS = ("kernels", "equivalence", "speed", "e2e")
BUDGET_S = {"kernels": 60, "equivalence": 120, "speed": 120, "e2e": 140}  # the default deadline: 440 s
OUT_LIMIT_MIB = 8  # what --out may weigh: small enough to copy off a remote GPU machine


def environment(dry: bool) -> dict:
    """What ran: the command, the date, the machine and versions (``results_io.header``), and the
    GPU's own details: CUDA, Triton, cuDNN, driver, shared memory per block."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    env = {**header(), "dry_run": dry, "torch_cuda": torch.version.cuda, "triton": triton_version}
    if not dry:
        try:
            driver = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.strip()
                or None
            )
        except (OSError, subprocess.TimeoutExpired):
            driver = None
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            "cudnn": torch.backends.cudnn.version(),
            "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
            "driver": driver,
        }
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
        widths = (11, 46, 60, 16, 7)  # padding only: a longer cell is never cut
        return "| " + " | ".join(c.replace("|", "/").ljust(w) for c, w in zip(cells, widths)) + " |"

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(self.line((row.section, row.case, row.value, row.target, row.status)), flush=True)
        if row.status == "FAIL" and row.detail:
            print(row.detail, file=sys.stderr, flush=True)
        self.save()

    def save(self) -> None:
        atomic_write_text(
            self.out / "results.json",
            json.dumps(
                {
                    "environment": self.env,
                    "sections": self.sections,
                    "rows": [asdict(r) for r in self.rows],
                    "exit_status": self.exit_status(),
                },
                indent=1,
            ),
        )
        lines = [self.line(self.HEADER), "|" + "---|" * 5]
        lines += [self.line((r.section, r.case, r.value, r.target, r.status)) for r in self.rows]
        details = [f"### {r.section}: {r.case}\n\n```\n{r.detail}\n```" for r in self.rows if r.detail]
        atomic_write_text(self.out / "table.md", "\n".join(lines) + "\n\n## Details\n\n" + "\n\n".join(details) + "\n")

    def exit_status(self) -> int:
        statuses = {r.status for r in self.rows}
        return 1 if "FAIL" in statuses else 3 if "TIMEOUT" in statuses else 2 if "MISS" in statuses else 0


def out_folder_row(out: Path) -> Row:
    """The evidence has to travel back: ``--out`` weighs a few MB at most and holds no checkpoint."""
    files = [p for p in out.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files) / 2**20
    largest = max(files, key=lambda p: p.stat().st_size)
    heavy = [str(p.relative_to(out)) for p in files if p.suffix in (".ckpt", ".tar", ".pt", ".pth")]
    value = (
        f"{total:.2f} MiB in {len(files)} files, largest {largest.relative_to(out)} "
        f"({largest.stat().st_size / 2**20:.2f} MiB)"
    )
    ok = total <= OUT_LIMIT_MIB and not heavy
    return Row(
        "report",
        "--out folder",
        value,
        f"<= {OUT_LIMIT_MIB} MiB, no checkpoint",
        "PASS" if ok else "FAIL",
        "checkpoints or shards: " + ", ".join(heavy) if heavy else "",
    )


def section_rows(section: str, out: Path, until: float, dry: bool) -> Iterator[Row]:
    if section == "e2e":
        yield from e2e(DRY_E2E if dry else FULL_E2E, out / "e2e", until, dry)
        return
    cases = {"kernels": KERNEL_CASES, "equivalence": equivalence_cases(), "speed": SPEED_CASES}[section]
    command = [sys.executable, "-m", "benchmarks.gpu_check.cases", section, *(["--dry-run"] if dry else [])]
    yield from run_cases(command, cases, out / f"{section}.log", until, section, env=child_env(dry))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (no GPU needed)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default gpu_check-<UTC time>)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=sum(BUDGET_S.values()),
        help="seconds for the whole check; section budgets are scaled to it",
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (use --dry-run to exercise the script on the CPU)", file=sys.stderr)
        return 1
    out = args.out or Path(f"gpu_check-{datetime.datetime.now(datetime.UTC):%Y%m%d-%H%M%S}")
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
    report.add(out_folder_row(out))
    print(f"gpu_check: {time.monotonic() - start:.0f} s; results in {out}", file=sys.stderr)
    return report.exit_status()


if __name__ == "__main__":
    sys.exit(main())
