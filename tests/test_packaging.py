"""README's two commands, ``.ci/run`` and the dependency pins stay consistent."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_readme_quick_start_is_two_commands_and_ci_runs_the_second():
    quick = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    setup, tests = _bash_blocks(quick)
    assert "\n" not in setup and "\n" not in tests
    assert "pip install -e '.[test]' -c constraints.txt" in setup and setup.endswith("locatdino demo")
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert any("pip install --quiet -e '.[test]' -c constraints.txt" in line for line in ci)
    assert ci[-1] == tests  # exactly README's test command, last


def test_pyproject_declares_ranges_and_the_constraints_pin_a_pair_inside_them():
    deps = {
        r.name: r
        for r in map(Requirement, tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    }
    pins = {
        r.name: r
        for r in map(
            Requirement,
            (line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")),
        )
    }
    assert set(pins) == {"torch", "torchvision"}
    for name, pin in pins.items():
        (spec,) = pin.specifier
        assert spec.operator == "==" and deps[name].specifier.contains(spec.version)
        assert not any(s.operator == "==" for s in deps[name].specifier), name  # a range, not a pin
