"""The evaluation packages import downwards only, and never each other's private names.

``locatdino.evaluation`` is the floor every frozen-backbone evaluation stands on (splits, views,
the frozen encoder, the mIoU, intervals, provenance, shared options); Hummingbird
(``retrieval``), the probes and ``compare`` build on it. Read from the source with ``ast``, so a
lazy import inside a function counts as much as one at the top of a module.
"""

import ast
from pathlib import Path

import pytest

import locatdino

PACKAGE = Path(locatdino.__file__).parent
PROTOCOLS = ("retrieval", "probes", "comparison")
ABOVE_THE_FLOOR = (*PROTOCOLS, "ssl")


def imports(source: str, module: str) -> list[tuple[str, str | None]]:
    """``(imported module, imported name or None)`` of every import in ``source`` (the text of
    ``module``, dotted), relative ones resolved; ``mod._name`` attribute reads of an imported
    locatdino module count as importing ``_name`` from it."""
    found, modules = [], {}
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, None))
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).rstrip(".")
            for alias in node.names:
                found.append((base, alias.name))
                modules[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            target = modules[node.value.id]
            if target.startswith("locatdino.") and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append((target, node.attr))
    return found


def subpackage(module: str) -> str | None:
    """``retrieval`` of ``locatdino.retrieval.report`` (None for top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def violations(source: str, module: str) -> list[str]:
    """What ``module`` imports that breaks the layering (see the module docstring)."""
    home, problems = subpackage(module), []
    for target, name in imports(source, module):
        if not target.startswith("locatdino"):
            continue
        there = subpackage(target) or (name if target == "locatdino" and (PACKAGE / str(name)).is_dir() else None)
        if home == "evaluation" and there in ABOVE_THE_FLOOR:
            problems.append(f"{module} imports {target} (the evaluation floor imports no protocol)")
        private = name is not None and name.startswith("_") and not name.startswith("__")
        if private and there != home:
            problems.append(f"{module} imports the private {target}.{name} from another package")
    return problems


def package_modules() -> list[tuple[str, Path]]:
    return [("locatdino." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"), p)
            for p in sorted(PACKAGE.rglob("*.py"))]


def test_the_checker_catches_what_it_forbids():
    """Guards the test below from passing vacuously: each kind of violation is reported."""
    assert violations("from locatdino.retrieval.report import _fmt\n", "locatdino.probes.probe_report") == [
        "locatdino.probes.probe_report imports the private locatdino.retrieval.report._fmt from another package"]
    assert violations("from locatdino.retrieval import report\nx = report._fmt(1.0)\n",
                      "locatdino.comparison.report") == [
        "locatdino.comparison.report imports the private locatdino.retrieval.report._fmt from another package"]
    assert violations("def f():\n    from locatdino.ssl import DINOModule\n", "locatdino.evaluation.features") == [
        "locatdino.evaluation.features imports locatdino.ssl (the evaluation floor imports no protocol)"]
    assert violations("from ..retrieval.evaluate import hummingbird\n", "locatdino.evaluation.splits") == [
        "locatdino.evaluation.splits imports locatdino.retrieval.evaluate (the evaluation floor imports no protocol)"]
    assert violations("from locatdino import probes\n", "locatdino.evaluation.views") == [
        "locatdino.evaluation.views imports locatdino (the evaluation floor imports no protocol)"]
    assert violations("from locatdino.retrieval.report import _PHASES\n", "locatdino.retrieval.cli") == []  # own package
    assert violations("from locatdino.evaluation.tables import number_cell\n", "locatdino.probes.probe_report") == []


@pytest.mark.parametrize("module, path", package_modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_respect_the_layering(module, path):
    assert violations(path.read_text(), module) == []


def test_the_probes_do_not_need_hummingbird():
    """Opening a dataset, running a frozen encoder or scoring an mIoU is the floor's, not Hummingbird's."""
    probes = [(m, p) for m, p in package_modules() if subpackage(m) == "probes"]
    assert len(probes) >= 8
    assert [(m, t) for m, p in probes for t, _ in imports(p.read_text(), m) if t.startswith("locatdino.retrieval")] == []
