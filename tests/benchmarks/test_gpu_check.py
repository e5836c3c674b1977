"""benchmarks/gpu_check/: the dry run (every case built and run at toy size on the CPU, so the
script is ready for the next GPU), the deadline and crash handling of its child processes, whole
error texts in its results, the size of what it leaves in --out, and the bf16 equivalence
criterion on full-size CPU results."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import benchmarks.gpu_check.cases as cases
import locatdino.models.gaug.attention as attention_module
from benchmarks.gpu_check import check as gpu_check
from benchmarks.gpu_check.common import FULL, Row, error_row

ROOT = Path(__file__).resolve().parents[2]

# A stand-in child speaking the @@ protocol: case "sleep" hangs, case "die" kills its process.
FAKE_CHILD = textwrap.dedent("""
    import json, os, sys, time
    for case in sys.argv[1:]:
        print("@@start", case, flush=True)
        if case == "sleep":
            time.sleep(60)
        if case == "die":
            print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
            os._exit(7)
        row = dict(section="s", case=case, value="ran in pid %d" % os.getpid())
        print("@@row", json.dumps(row), flush=True)
        print("@@done", case, flush=True)
""")


def _fake_cases(cases_, tmp_path, seconds):
    start = time.monotonic()
    rows = list(
        gpu_check.run_cases(
            [sys.executable, "-c", FAKE_CHILD], cases_, tmp_path / "child.log", start + seconds, "s", title=str
        )
    )
    return rows, time.monotonic() - start


def test_the_deadline_stops_a_section_that_sleeps(tmp_path):
    rows, took = _fake_cases(["a", "sleep", "b"], tmp_path, 1.5)
    assert [(r.case, r.status) for r in rows] == [("a", "PASS"), ("sleep", "TIMEOUT"), ("b", "TIMEOUT")]
    assert rows[1].value == "stopped at the section's deadline" and rows[2].value.startswith("not run")
    assert took < 30  # killed, not waited for (the case sleeps 60 s)
    assert "killed at the section's deadline, in case sleep" in (tmp_path / "child.log").read_text()


def test_a_child_that_dies_fails_only_its_case(tmp_path):
    rows, _ = _fake_cases(["a", "die", "b"], tmp_path, 60)
    assert [(r.case, r.status) for r in rows] == [("a", "PASS"), ("die", "FAIL"), ("b", "PASS")]
    assert "died in this case (exit 7)" in rows[1].value
    assert rows[1].detail.endswith("@@start die\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert rows[0].value != rows[2].value  # b ran in a fresh process


LONG_ERROR = (
    "No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_4 "
    "Required: 376832 Hardware limit: 232448. Reducing block sizes or num_stages may help.\n"
    "  second line of the detail\n" + "x" * 300
)


def test_whole_error_texts_reach_results_json_and_table_md(tmp_path):
    try:
        raise RuntimeError(LONG_ERROR)
    except RuntimeError as exc:
        row = error_row("speed", "a case", exc)
    assert row.status == "FAIL" and row.value == "RuntimeError: " + LONG_ERROR.splitlines()[0]
    assert row.detail == "RuntimeError: " + LONG_ERROR  # every line, nothing cut at a table's width
    report = gpu_check.Report(tmp_path, {"torch": torch.__version__})
    report.add(row)
    report.add(Row("speed", "another case", "12.0 ms (1.02x)"))
    [saved, other] = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert saved["detail"] == row.detail and other["detail"] == ""
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n| speed ") == 2 and f"### speed: a case\n\n```\n{row.detail}\n```" in table


def test_the_out_folder_row_refuses_checkpoints_and_weight(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    assert gpu_check.out_folder_row(tmp_path).status == "PASS"
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "last.ckpt").write_bytes(b"0" * 10)
    row = gpu_check.out_folder_row(tmp_path)
    assert row.status == "FAIL" and row.detail == "checkpoints or shards: e2e/last.ckpt"
    (tmp_path / "e2e" / "last.ckpt").unlink()
    (tmp_path / "big.log").write_bytes(b"0" * (gpu_check.OUT_LIMIT_MIB * 2**20 + 1))
    assert gpu_check.out_folder_row(tmp_path).status == "FAIL"


def _full_size_case(reg_tokens, px):
    """The fp64 truth and the bf16 reference (CPU path) of a full-size equivalence case: ViT-S width, 2 blocks."""
    model = cases.equivalence_model(FULL, reg_tokens)
    g = torch.Generator().manual_seed(px)
    x = torch.randn(2, 3, px, px, generator=g)
    grad_out = torch.randn(2, model.num_prefix_tokens + (px // 16) ** 2, model.embed_dim, generator=g)
    cpu = torch.device("cpu")
    run = lambda dtype, path: cases.forward_backward(model, x, grad_out, cpu, dtype, path)  # noqa: E731
    return cases.tensor_names(model), run(torch.float64, "separable"), run(torch.bfloat16, "separable"), run


@pytest.mark.parametrize(("reg_tokens", "px"), [(0, 96), (4, 224)], ids=["96 px, class token", "224 px, 4 registers"])
def test_bf16_criterion_passes_right_kernels_and_fails_a_1_percent_bias_error(monkeypatch, reg_tokens, px):
    names, want, want_bf16, run = _full_size_case(reg_tokens, px)
    got = run(torch.bfloat16, "mask")
    old_score = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
    verdict = cases.judge(got, want, names, want_bf16)
    assert verdict.ok, verdict
    assert 0 < verdict.error <= verdict.limit and verdict.reference_error > 0
    assert cases.judge(run(torch.float32, "mask"), want, names).ok
    assert cases.judge(run(torch.float64, "mask"), want, names, limit=cases.FP64_LIMIT).ok  # the maths, exactly

    mask = attention_module.outer_product_mask
    monkeypatch.setattr(attention_module, "outer_product_mask", lambda r, c, p, dt: mask(1.01 * r, c, p, dt))
    wrong = cases.judge(run(torch.bfloat16, "mask"), want, names, want_bf16)
    assert not wrong.ok, wrong
    assert not cases.judge(run(torch.float32, "mask"), want, names).ok
    if px == 96:
        assert old_score > 5e-2  # the max-abs score the check used to apply failed this right kernel


@pytest.mark.slow
def test_dry_run_builds_and_passes_every_case(tmp_path):
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--out", str(out), "--deadline", "1200"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines() if line.startswith("| ")
    ][1:]
    by_section = {}
    for section, case, _value, _target, status in rows:
        by_section.setdefault(section, []).append((case, status))
    # chooser + SDPA + 6 options; 6 shapes x 3 paths x 2 dtypes; 3 cases x 4 models;
    # 2 fits + 2 hbird comparisons; the --out check
    counts = {"kernels": 8, "equivalence": 36, "speed": 12, "e2e": 4, "report": 1}
    assert {k: len(v) for k, v in by_section.items()} == counts
    assert all(status == "PASS" for section in ("equivalence", "e2e", "report") for _, status in by_section[section])
    assert by_section["kernels"][0] == ("options the chooser takes (bf16)", "PASS")
    assert {case for case, _ in by_section["e2e"]} >= {
        "locatdino fit dino_tiny_cpu vit_tiny_patch16_224, 2 steps, strategy ddp",
        "locatdino fit dino_tiny_cpu locatvit_tiny_patch8_224, 2 steps, strategy auto",
        "locatdino hbird locatvit_tiny_patch8_224 32 px",
        "locatdino hbird vit_tiny_patch16_224 32 px",
    }
    results = json.loads((out / "results.json").read_text())
    assert len(results["rows"]) == len(rows) and results["exit_status"] == 0
    assert (
        set(results["sections"]) == set(counts) - {"report"}
        and results["environment"]["machine"]["software"]["torch"] == torch.__version__.split("+")[0]
    )
    assert all("detail" in row for row in results["rows"])
    assert "flex options: {'bfloat16, head size 32, cpu': 'BLOCK_M=64 BLOCK_N=32 num_stages=1, fp32 profiles'}" in next(
        r["detail"] for r in results["rows"] if r["case"] == "flex bf16 224 px, class token"
    )
    assert (out / "table.md").read_text().startswith("\n".join(proc.stdout.splitlines()[:1]))
    log = (out / "equivalence.log").read_text()
    assert (
        "@@done flex-bf16-224-cls" in log and "INFO locatdino.models.gaug.flex_bias_attention: FlexAttention for" in log
    )
    for run in ("fit-vit_tiny_patch16_224", "fit-locatvit_tiny_patch8_224"):
        assert len(json.loads((out / "e2e" / run / "step_times.json").read_text())["step_end_s"]) == 2
        assert (out / "e2e" / run / "logs" / "version_0" / "metrics.csv").is_file()
        assert "fit" in (out / "e2e" / f"{run}.log").read_text()
    hbird_runs = [json.loads(p.read_text())["models"] for p in (out / "e2e").glob("hbird-*/results.json")]
    assert [len(models) for models in hbird_runs] == [2, 2]  # both teachers, on the device and on the CPU
    # nothing heavy came back: no checkpoint, no shard; the scratch folder (shards, checkpoints) is gone
    assert not [p for p in out.rglob("*") if p.suffix in (".ckpt", ".tar")]
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 2**20
    assert not list(scratch.iterdir())
