"""The package imports downwards only, and never another package's private names.

``locatdino.common`` (every command's shared helpers) is the lowest floor: it imports nothing of
locatdino outside itself. Above it the backbones and data, then ``locatdino.evaluation``, the floor
every frozen-backbone evaluation stands on (splits, views, the frozen encoder, the mIoU, intervals,
provenance, shared options); Hummingbird (``retrieval``), the probes and pretraining (``ssl``)
build on it, ``compare`` on those, and the entry points (``cli``, ``demo``) on everything. Packages
of one layer never import each other (the probes do not need Hummingbird). Inside ``ssl`` the same
holds for its sub-packages: the objectives stand on what they share (``objective``), the ``fit``
run (``run``) on all of them. Read from the source with ``ast``, so a lazy import inside a function
counts as much as one at the top of a module.
"""

import ast
from pathlib import Path

import pytest

import locatdino

PACKAGE = Path(locatdino.__file__).parent
# the layer of each sub-package of locatdino: a module imports from lower layers and its own package
LAYERS = {
    "common": 0,
    "models": 1,
    "data": 1,
    "configs": 1,
    "evaluation": 2,
    "retrieval": 3,
    "probes": 3,
    "ssl": 3,
    "comparison": 4,
}
ENTRY_POINTS = {"__init__", "__main__", "cli", "demo"}  # the package root holds these only
ROOT_LAYER = 1.5  # ``import locatdino`` (the root __init__: version, timm registration) stands on common and models
# what each sub-package of ``ssl`` may import of the others ("" is ``locatdino.ssl`` itself)
SSL_LAYERS = {
    "objective": set(),
    "logs": set(),
    "dino": {"objective"},
    "supervised": {"objective"},
    "ibot": {"objective", "dino"},
    "distill": {"objective", "dino"},
    "export": {"logs"},
    "run": {"", "objective", "dino", "ibot", "distill", "supervised", "logs"},
}
SSL_MOST_ENTRIES = 9


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
    """``retrieval`` of ``locatdino.retrieval.report`` (None for the package root and its modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def ssl_part(module: str) -> str | None:
    """``run`` of ``locatdino.ssl.run.cli``, ``""`` of ``locatdino.ssl``, None outside ``ssl``."""
    parts = module.split(".")
    if parts[1:2] != ["ssl"]:
        return None
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and (PACKAGE / "ssl" / parts[2]).is_dir()) else ""


def layer(module: str, name: str | None) -> float | None:
    """The layer of what ``from module import name`` reaches (None: an entry point of the root)."""
    there = subpackage(module) or (name if module == "locatdino" and (PACKAGE / str(name)).is_dir() else None)
    if there is not None:
        return LAYERS[there]
    if module == "locatdino" and name is not None and name in ENTRY_POINTS:
        return None
    return ROOT_LAYER if module.split(".")[1:] in ([], ["__init__"]) else None


def violations(source: str, module: str) -> list[str]:
    """What ``module`` imports that breaks the layering (see the module docstring)."""
    home, problems = subpackage(module), []
    for target, name in imports(source, module):
        if not target.startswith("locatdino"):
            continue
        there = subpackage(target) or (name if target == "locatdino" and (PACKAGE / str(name)).is_dir() else None)
        if home is not None and there != home:
            reached = layer(target, name)
            if reached is None or reached >= LAYERS[home]:
                what = "an entry point" if reached is None else f"layer {reached}"
                problems.append(f"{module} imports {target} ({what}; {home} is layer {LAYERS[home]})")
        if home == "ssl" and there == "ssl" and ssl_part(module) != "":
            inner = ssl_part(
                target if name is None or not (PACKAGE / "ssl" / str(name)).is_dir() else f"{target}.{name}"
            )
            if inner != ssl_part(module) and inner not in SSL_LAYERS[ssl_part(module)]:
                problems.append(
                    f"{module} imports {target} (ssl.{ssl_part(module)} may import "
                    f"{sorted(SSL_LAYERS[ssl_part(module)]) or 'no other part of ssl'})"
                )
        private = name is not None and name.startswith("_") and not name.startswith("__")
        if private and there != home:
            problems.append(f"{module} imports the private {target}.{name} from another package")
    return problems


def package_modules() -> list[tuple[str, Path]]:
    return [
        ("locatdino." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"), p)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def test_the_checker_catches_what_it_forbids():
    """Guards the test below from passing vacuously: each kind of violation is reported."""
    assert violations("from locatdino.retrieval.report import _fmt\n", "locatdino.probes.probe_report") == [
        "locatdino.probes.probe_report imports locatdino.retrieval.report (layer 3; probes is layer 3)",
        "locatdino.probes.probe_report imports the private locatdino.retrieval.report._fmt from another package",
    ]
    assert violations(
        "from locatdino.retrieval import report\nx = report._fmt(1.0)\n", "locatdino.comparison.report"
    ) == ["locatdino.comparison.report imports the private locatdino.retrieval.report._fmt from another package"]
    assert violations("def f():\n    from locatdino.ssl import DINOModule\n", "locatdino.evaluation.features") == [
        "locatdino.evaluation.features imports locatdino.ssl (layer 3; evaluation is layer 2)"
    ]
    assert violations("from ..retrieval.evaluate import hummingbird\n", "locatdino.evaluation.splits") == [
        "locatdino.evaluation.splits imports locatdino.retrieval.evaluate (layer 3; evaluation is layer 2)"
    ]
    assert violations("from locatdino import probes\n", "locatdino.evaluation.views") == [
        "locatdino.evaluation.views imports locatdino (layer 3; evaluation is layer 2)"
    ]
    assert violations("from locatdino.models import create_backbone\n", "locatdino.common.arguments") == [
        "locatdino.common.arguments imports locatdino.models (layer 1; common is layer 0)"
    ]
    assert violations("import locatdino\n", "locatdino.common.errors") == [
        "locatdino.common.errors imports locatdino (layer 1.5; common is layer 0)"
    ]
    assert violations("from locatdino import cli\n", "locatdino.ssl.run.cli") == [
        "locatdino.ssl.run.cli imports locatdino (an entry point; ssl is layer 3)"
    ]
    assert violations("from locatdino.ssl.dino.loss import DINOLoss\n", "locatdino.ssl.objective.base") == [
        "locatdino.ssl.objective.base imports locatdino.ssl.dino.loss (ssl.objective may import no other part of ssl)"
    ]
    assert violations("from locatdino.ssl import run\n", "locatdino.ssl.dino.module") == [
        "locatdino.ssl.dino.module imports locatdino.ssl (ssl.dino may import ['objective'])"
    ]
    assert violations("from locatdino.ssl import DINOHead\n", "locatdino.ssl.ibot.module") == [
        "locatdino.ssl.ibot.module imports locatdino.ssl (ssl.ibot may import ['dino', 'objective'])"
    ]
    assert (
        violations("from locatdino.retrieval.report import _PHASES\n", "locatdino.retrieval.cli") == []
    )  # own package
    assert violations("from locatdino.evaluation.tables import number_cell\n", "locatdino.probes.probe_report") == []
    assert violations("from locatdino.ssl.objective import DINOHead\n", "locatdino.ssl.ibot.module") == []
    assert (
        violations("from locatdino.common.errors import UserError\nimport locatdino\n", "locatdino.ssl.export.cli")
        == []
    )


def test_the_layer_tables_cover_the_package_and_form_no_circle():
    """Every sub-package has a layer (a new one must be placed), and the allowed imports inside
    ``ssl`` can be ordered: no sub-package reaches itself through the others."""
    assert set(LAYERS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(SSL_LAYERS) == {p.name for p in (PACKAGE / "ssl").iterdir() if (p / "__init__.py").is_file()}
    placed: list[str] = []
    while len(placed) < len(SSL_LAYERS):  # Kahn's order; a circle leaves no part to place
        ready = [part for part, below in SSL_LAYERS.items() if part not in placed and below - {""} <= set(placed)]
        assert ready, f"circle among {sorted(set(SSL_LAYERS) - set(placed))}"
        placed += ready
    assert placed.index("run") == len(placed) - 1 and placed.index("objective") < placed.index("dino")


def test_the_package_root_holds_the_entry_points_only():
    """Helpers live in packages (``common`` for every command's); the root keeps what a user runs."""
    assert {p.stem for p in PACKAGE.glob("*.py")} == ENTRY_POINTS


def test_ssl_keeps_a_short_top_level():
    """One sub-package per role: modules and sub-packages at the top of ``ssl`` together stay few."""
    ssl = PACKAGE / "ssl"
    entries = [p.name for p in ssl.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()]
    assert "__init__.py" in entries and len(entries) <= SSL_MOST_ENTRIES, sorted(entries)
    assert [
        p.name for p in ssl.iterdir() if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").is_file()
    ] == []  # no folder outside the count


@pytest.mark.parametrize("module, path", package_modules(), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_respect_the_layering(module, path):
    assert violations(path.read_text(), module) == []


def test_the_probes_do_not_need_hummingbird():
    """Opening a dataset, running a frozen encoder or scoring an mIoU is the floor's, not Hummingbird's."""
    probes = [(m, p) for m, p in package_modules() if subpackage(m) == "probes"]
    assert len(probes) >= 8
    assert [
        (m, t) for m, p in probes for t, _ in imports(p.read_text(), m) if t.startswith("locatdino.retrieval")
    ] == []
