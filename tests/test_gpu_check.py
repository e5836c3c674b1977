"""benchmarks/gpu_check.py: the dry run (every case built and run at toy size on the CPU, so the
script is ready for the next GPU), the deadline and crash handling of its child processes, and the
bf16 equivalence criterion on full-size CPU results."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_check_cases as cases  # noqa: E402

import locatdino.models.gaug.attention as attention_module  # noqa: E402

# A stand-in child speaking the @@ protocol: case "sleep" hangs, case "die" kills its process.
FAKE_CHILD = textwrap.dedent("""
    import json, os, sys, time
    for case in sys.argv[1:]:
        print("@@start", case, flush=True)
        if case == "sleep":
            time.sleep(60)
        if case == "die":
            os._exit(7)
        row = dict(section="s", case=case, value="ran in pid %d" % os.getpid())
        print("@@row", json.dumps(row), flush=True)
        print("@@done", case, flush=True)
""")


def _fake_cases(cases_, tmp_path, seconds):
    start = time.monotonic()
    rows = list(gpu_check.run_cases([sys.executable, "-c", FAKE_CHILD], cases_, tmp_path / "child.log",
                                    start + seconds, "s", title=str))
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
    assert rows[0].value != rows[2].value  # b ran in a fresh process


def _full_size_case(reg_tokens, px):
    """fp32 and bf16 references (CPU path) of a full-size equivalence case: ViT-S width, 2 blocks."""
    model = cases.equivalence_model(cases.FULL, reg_tokens)
    g = torch.Generator().manual_seed(px)
    x = torch.randn(2, 3, px, px, generator=g)
    grad_out = torch.randn(2, model.num_prefix_tokens + (px // 16) ** 2, model.embed_dim, generator=g)
    cpu = torch.device("cpu")
    run = lambda dtype, path: cases.forward_backward(model, x, grad_out, cpu, dtype, path)  # noqa: E731
    return cases.tensor_names(model), run(torch.float32, "separable"), run(torch.bfloat16, "separable"), run


@pytest.mark.parametrize(("reg_tokens", "px"), [(0, 96), (4, 224)], ids=["96 px, class token", "224 px, 4 registers"])
def test_bf16_criterion_passes_right_kernels_and_fails_a_1_percent_bias_error(monkeypatch, reg_tokens, px):
    names, want, want_bf16, run = _full_size_case(reg_tokens, px)
    got = run(torch.bfloat16, "mask")
    old_score = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
    verdict = cases.judge(got, want, names, want_bf16)
    assert verdict.ok, verdict
    assert cases.judge(run(torch.float32, "mask"), want, names).ok

    mask = attention_module.outer_product_mask
    monkeypatch.setattr(attention_module, "outer_product_mask", lambda r, c, p, dt: mask(1.01 * r, c, p, dt))
    wrong = cases.judge(run(torch.bfloat16, "mask"), want, names, want_bf16)
    assert not wrong.ok, wrong
    assert not cases.judge(run(torch.float32, "mask"), want, names).ok
    if px == 96:
        assert old_score > 5e-2  # the max-abs score the check used to apply failed this right kernel


@pytest.mark.slow
def test_dry_run_builds_and_passes_every_case(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--deadline", "1200"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| ")][1:]
    by_section = {}
    for section, case, value, target, status in rows:
        by_section.setdefault(section, []).append((case, status))
    # 2 paths x 2 prefixes x 3 resolutions x 2 dtypes; 3 cases x 3 models; 2 fits + 2 hbird comparisons
    assert {k: len(v) for k, v in by_section.items()} == {"equivalence": 24, "speed": 9, "e2e": 4}
    assert all(status == "PASS" for _, status in by_section["equivalence"] + by_section["e2e"])
    assert {case for case, _ in by_section["e2e"]} >= {
        "locatdino fit tiny_vit, 2 steps, strategy ddp", "locatdino fit tiny_locatvit, 2 steps, strategy auto",
        "locatdino hbird locatvit_tiny 32 px", "locatdino hbird vit_tiny_patch16_224 32 px"}
    results = json.loads((out / "results.json").read_text())
    assert len(results["rows"]) == len(rows) and results["exit_status"] == 0
    assert set(results["sections"]) == {"equivalence", "e2e", "speed"} and results["environment"]["torch"]
    assert (out / "table.md").read_text().count("\n") == len(rows) + 2
    assert "@@done flex-bf16-224-cls" in (out / "equivalence-flex.log").read_text()
    for run in ("fit-tiny_vit", "fit-tiny_locatvit"):
        assert len(json.loads((out / "e2e" / run / "step_times.json").read_text())["step_end_s"]) == 2
        assert "fit" in (out / "e2e" / f"{run}.log").read_text()
    assert len(list((out / "e2e").glob("hbird-*/*/results.json"))) == 4
