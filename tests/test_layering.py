"""The package imports downwards only, and never another package's private names.

``locatdino.common`` (every command's shared helpers) is the lowest floor: it imports nothing of
locatdino outside itself. Above it the backbones and data; above those pretraining (``ssl``) and
the evaluation of frozen backbones (``evaluation``), which never import each other; the entry
points (``cli``, ``demo``) stand on everything. Inside ``ssl`` and ``evaluation`` the same holds
for their sub-packages (:data:`INNER`): the objectives stand on what they share (``objective``),
the ``fit`` run (``run``) on all of them; each evaluation command (a folder named after it) on the
evaluation floor (the modules of ``evaluation`` itself, ``""``), ``compare`` on the other commands
too, and the floor on no command. Read from the source with ``ast``, so a lazy import inside a
function counts as much as one at the top of a module. Each rule is one test that lists every
offender.
"""

import ast
from pathlib import Path

import locatdino

PACKAGE = Path(locatdino.__file__).parent
# the layer of each sub-package of locatdino: a module imports from lower layers and its own package
LAYERS = {
    "common": 0,
    "models": 1,
    "data": 1,
    "configs": 1,
    "evaluation": 2,
    "ssl": 2,
}
ENTRY_POINTS = {"__init__", "__main__", "cli", "demo"}  # the package root holds these only
ROOT_LAYER = 1.5  # ``import locatdino`` (the root __init__: version, timm registration) stands on common and models
# what each part of a layered package may import of its other parts ("": the package's own modules;
# a part missing from the table, like ``ssl``'s own modules, may import every part)
INNER: dict[str, dict[str, set[str]]] = {
    "ssl": {
        "objective": set(),
        "logs": set(),
        "dino": {"objective"},
        "supervised": {"objective"},
        "ibot": {"objective", "dino"},
        "distill": {"objective", "dino"},
        "export": {"logs"},
        "run": {"", "objective", "dino", "ibot", "distill", "supervised", "logs"},
    },
    "evaluation": {
        "": set(),
        "hbird": {""},
        "linprobe": {""},
        "knn": {""},
        "lincls": {""},
        "compare": {"", "hbird", "linprobe", "knn", "lincls"},
    },
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
    """``evaluation`` of ``locatdino.evaluation.hbird.report`` (None for the package root and its modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def inner_part(module: str, package: str) -> str | None:
    """``run`` of ``locatdino.ssl.run.cli`` (package ``ssl``), ``""`` of ``locatdino.ssl`` or
    ``locatdino.evaluation.splits``, None outside ``package``."""
    parts = module.split(".")
    if parts[1:2] != [package]:
        return None
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and (PACKAGE / package / parts[2]).is_dir()) else ""


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
        if home in INNER and there == home:
            problems += inner_violations(module, target, name, home)
        private = name is not None and name.startswith("_") and not name.startswith("__")
        if private and owner(target, there) != owner(module, home):
            problems.append(f"{module} imports the private {target}.{name} from another package")
    return problems


def owner(module: str, package: str | None) -> tuple[str | None, str | None]:
    """Whose private names ``module`` may use: its sub-package's, or in a layered package its part's."""
    return package, inner_part(module, package) if package in INNER else None


def inner_violations(module: str, target: str, name: str | None, package: str) -> list[str]:
    """What ``from target import name`` in ``module`` breaks of :data:`INNER` inside ``package``."""
    table, part = INNER[package], inner_part(module, package)
    if part not in table:
        return []
    reached = target if name is None or not (PACKAGE / package / str(name)).is_dir() else f"{target}.{name}"
    inner = inner_part(reached, package)
    if inner == part or inner in table[part]:
        return []
    where = f"{package}.{part}" if part else f"{package}'s own modules"
    return [f"{module} imports {target} ({where} may import {sorted(table[part]) or f'no other part of {package}'})"]


def package_modules() -> list[tuple[str, Path]]:
    return [
        ("locatdino." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"), p)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def test_the_checker_catches_what_it_forbids():
    """Guards the tests below from passing vacuously: each kind of violation is reported."""
    assert violations("from locatdino.evaluation.hbird.report import _fmt\n", "locatdino.evaluation.knn.report") == [
        "locatdino.evaluation.knn.report imports locatdino.evaluation.hbird.report (evaluation.knn may import [''])",
        "locatdino.evaluation.knn.report imports the private locatdino.evaluation.hbird.report._fmt "
        "from another package",
    ]
    assert violations("from locatdino.evaluation.hbird.options import _x\n", "locatdino.evaluation.compare.cli") == [
        "locatdino.evaluation.compare.cli imports the private locatdino.evaluation.hbird.options._x "
        "from another package"
    ]
    assert violations("from locatdino.evaluation import hbird\nx = hbird._fmt(1.0)\n", "locatdino.ssl.run.cli") == [
        "locatdino.ssl.run.cli imports locatdino.evaluation (layer 2; ssl is layer 2)",
        "locatdino.ssl.run.cli imports locatdino.evaluation.hbird (layer 2; ssl is layer 2)",
        "locatdino.ssl.run.cli imports the private locatdino.evaluation.hbird._fmt from another package",
    ]
    assert violations("def f():\n    from locatdino.ssl import DINOModule\n", "locatdino.evaluation.features") == [
        "locatdino.evaluation.features imports locatdino.ssl (layer 2; evaluation is layer 2)"
    ]
    assert violations("from .hbird.evaluate import hummingbird\n", "locatdino.evaluation.splits") == [
        "locatdino.evaluation.splits imports locatdino.evaluation.hbird.evaluate "
        "(evaluation's own modules may import no other part of evaluation)"
    ]
    assert violations("from locatdino.evaluation import knn\n", "locatdino.evaluation.lincls.cli") == [
        "locatdino.evaluation.lincls.cli imports locatdino.evaluation (evaluation.lincls may import [''])"
    ]
    assert violations("from locatdino import evaluation\n", "locatdino.models.locatvit") == [
        "locatdino.models.locatvit imports locatdino (layer 2; models is layer 1)"
    ]
    assert violations("from locatdino.models import create_backbone\n", "locatdino.common.arguments") == [
        "locatdino.common.arguments imports locatdino.models (layer 1; common is layer 0)"
    ]
    assert violations("import locatdino\n", "locatdino.common.errors") == [
        "locatdino.common.errors imports locatdino (layer 1.5; common is layer 0)"
    ]
    assert violations("from locatdino import cli\n", "locatdino.ssl.run.cli") == [
        "locatdino.ssl.run.cli imports locatdino (an entry point; ssl is layer 2)"
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
    allowed = [
        ("from locatdino.evaluation.hbird.report import _PHASES\n", "locatdino.evaluation.hbird.cli"),  # own part
        ("from locatdino.evaluation.tables import number_cell\n", "locatdino.evaluation.linprobe.report"),
        ("from locatdino.evaluation.hbird import options\n", "locatdino.evaluation.compare.cli"),
        ("from locatdino.ssl.objective import DINOHead\n", "locatdino.ssl.ibot.module"),
        ("from locatdino.common.errors import UserError\nimport locatdino\n", "locatdino.ssl.export.cli"),
    ]
    assert [violations(source, module) for source, module in allowed] == [[]] * len(allowed)


def test_the_layer_tables_cover_the_package_and_form_no_circle():
    """Every sub-package has a layer (a new one must be placed), every part of a layered package is
    in its table, and the allowed imports inside each can be ordered: no part reaches itself
    through the others."""
    assert set(LAYERS) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    for package, table in INNER.items():
        parts = {p.name for p in (PACKAGE / package).iterdir() if (p / "__init__.py").is_file()}
        assert set(table) - {""} == parts, package
        placed: list[str] = [] if "" in table else [""]
        while len(placed) < len(table | {"": set()}):  # Kahn's order; a circle leaves no part to place
            ready = [part for part, below in table.items() if part not in placed and below <= set(placed)]
            assert ready, f"circle in {package} among {sorted(set(table) - set(placed))}"
            placed += ready
    assert INNER["ssl"]["run"] >= set(INNER["ssl"]) - {"run"} - {"export"}
    assert INNER["evaluation"]["compare"] == set(INNER["evaluation"]) - {"compare"}


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


def test_each_evaluation_command_lives_in_the_folder_named_after_it():
    """``locatdino hbird`` runs ``locatdino.evaluation.hbird.cli``, and so on for every evaluation command."""
    from locatdino.cli import COMMANDS

    evaluation = {name: module for name, (module, _) in COMMANDS.items() if module.startswith("locatdino.evaluation")}
    assert evaluation == {name: f"locatdino.evaluation.{name}.cli" for name in INNER["evaluation"] if name}


def test_imports_respect_the_layering():
    modules = package_modules()
    assert len(modules) > 150
    assert [problem for module, path in modules for problem in violations(path.read_text(), module)] == []
