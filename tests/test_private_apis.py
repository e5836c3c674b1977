"""``locatdino/`` reaches Lightning, argparse and jsonargparse through their public APIs only.

A private name (``_timeout``, ``_run_subcommand``, ``_action_groups``) can change in any upstream
release without notice, and code that writes or overrides one then breaks silently: the write
lands on an attribute nothing reads any more, the override is never called. Two things are
refused, read from the source with ``ast``:

- an import from another package's private module (``from timm.models._hub import ...``): only
  what a package exports is its API;
- an assignment to a private attribute of another object (``x._name = ...``, ``setattr(x,
  "_name", ...)``, where ``x`` is not ``self`` or ``cls``);
- a method with a private name (``_name``, not ``__dunder__``) overriding one that a Lightning,
  argparse or jsonargparse base class defines (the class imported to read its bases);
- an assignment through ``self`` or ``cls`` to a private attribute that such a base class uses
  itself (``self._timeout = ...`` in a subclass of a Lightning strategy): the object is ours, the
  attribute is upstream's.

The one override and the one write with no public route are :data:`ALLOWED` and
:data:`ALLOWED_WRITES`; ``test_the_allowed_override_still_exists_upstream`` fails when upstream
renames them. The writes of :data:`OTHER_OBJECTS` are to objects of
the project itself, timm or torch, each named with the reason.
"""

import ast
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

from lightning.pytorch.strategies import FSDPStrategy

import locatdino

PACKAGE = Path(locatdino.__file__).parent
UPSTREAM = ("lightning", "argparse", "jsonargparse")
# FSDP on the CPU must be wrapped with device_id=cpu before Lightning wraps it with a device index,
# which FSDPStrategy does in _setup_model alone (its public setup also converts precision and syncs
# batch norm around that call)
ALLOWED = {"locatdino.ssl.objective.fsdp.DINOFSDPStrategy._setup_model"}
# Lightning's FSDPStrategy takes its activation-checkpointing policy in __init__ only; the objective
# (model hparams) asks for it after the strategy is built, in the allowed _setup_model above
ALLOWED_WRITES = {"locatdino.ssl.objective.fsdp.DINOFSDPStrategy sets self._activation_checkpointing_kwargs"}
# private writes to objects that are not Lightning's, argparse's or jsonargparse's
OTHER_OBJECTS = {
    "locatdino.evaluation.hbird.memory sets bank._directory": "a MemoryBank, built by its own classmethods",
    "locatdino.evaluation.hbird.memory sets bank._staging": "a MemoryBank, built by its own classmethods",
    "locatdino.models.checkpoints.pos_embed sets model._pos_embed": "timm's ViT, whose position-embedding step "
    "(a method of the instance) the dino rule replaces",
    "locatdino.ssl.export.files sets saved._metadata": "a torch state dict: torch.save keeps and "
    "torch.load restores its _metadata",
}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_writes(source: str, module: str) -> list[str]:
    """Every assignment in ``source`` to a private attribute of an object other than self or cls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and ast.unparse(node.args[0]) not in ("self", "cls")
        ):
            found.append(f"{module} sets {ast.unparse(node.args[0])}.{node.args[1].value}")
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.ctx, ast.Store)
                    and private(part.attr)
                    and ast.unparse(part.value) not in ("self", "cls")
                ):
                    found.append(f"{module} sets {ast.unparse(part)}")
    return [write for write in found if write not in OTHER_OBJECTS]


def private_imports(source: str, module: str) -> list[str]:
    """Every import in ``source`` of a module with a private part, outside ``locatdino``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [
        f"{module} imports {name}"
        for name in names
        if name.split(".")[0] != "locatdino" and any(private(part) for part in name.split("."))
    ]


def private_overrides(source: str, module: ModuleType) -> list[str]:
    """Every method of a class of ``module`` (its text ``source``) with a private name that a
    Lightning, argparse or jsonargparse class among its bases defines, less :data:`ALLOWED`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or not hasattr(module, node.name):
            continue
        cls = getattr(module, node.name)
        for item in node.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or not private(item.name):
                continue
            owners = [
                base
                for base in cls.__mro__[1:]
                if item.name in vars(base) and base.__module__.partition(".")[0] in UPSTREAM
            ]
            where = f"{module.__name__}.{node.name}.{item.name}"
            if owners and where not in ALLOWED:
                found.append(f"{where} overrides {owners[0].__module__}.{owners[0].__qualname__}.{item.name}")
    return found


def _stored_attributes(node: ast.AST) -> list[ast.Attribute]:
    """The attributes ``node`` (an assignment, augmented or annotated) stores into."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [part for target in targets for part in ast.walk(target) if isinstance(part, ast.Attribute)]


def _upstream_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def upstream_owned_writes(source: str, module: ModuleType) -> list[str]:
    """Every write through ``self`` / ``cls`` in a class of ``module`` to a private attribute that a
    Lightning, argparse or jsonargparse class among its bases uses itself, less :data:`ALLOWED_WRITES`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or not hasattr(module, node.name):
            continue
        upstream = [b for b in getattr(module, node.name).__mro__[1:] if b.__module__.partition(".")[0] in UPSTREAM]
        written = {
            part.attr
            for item in ast.walk(node)
            if isinstance(item, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for part in _stored_attributes(item)
            if private(part.attr) and ast.unparse(part.value) in ("self", "cls")
        }
        for name in sorted(written):
            owner = next((b for b in upstream if re.search(rf"\bself\.{name}\b", _upstream_source(b))), None)
            where = f"{module.__name__}.{node.name} sets self.{name}"
            if owner is not None and where not in ALLOWED_WRITES:
                found.append(f"{where}, which {owner.__module__}.{owner.__qualname__} uses")
    return found


def package_modules() -> list[tuple[str, Path]]:
    return [
        ("locatdino." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__"), p)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def defines_private_methods(source: str) -> bool:
    return any(
        isinstance(node, ast.ClassDef)
        and any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(item.name) for item in node.body)
        for node in ast.walk(ast.parse(source))
    )


def planted(source: str) -> ModuleType:
    module = ModuleType("planted")
    exec(compile(source, "planted", "exec"), module.__dict__)
    return module


def test_the_checker_catches_what_it_forbids():
    """Guards the tests below from passing vacuously: each kind of violation is reported, and
    what is allowed is not."""
    assert private_writes("strategy._timeout = timedelta(seconds=5)\n", "m") == ["m sets strategy._timeout"]
    assert private_writes("def f(parser):\n    parser._action_groups = []\n", "m") == ["m sets parser._action_groups"]
    assert private_writes("a, b.c._d = 1, 2\nx._n += 1\nsetattr(trainer, '_x', 1)\n", "m") == [
        "m sets b.c._d",
        "m sets x._n",
        "m sets trainer._x",
    ]
    assert private_imports("from timm.models._hub import f\nimport torch._dynamo\nfrom . import _x\n", "m") == [
        "m imports timm.models._hub",
        "m imports torch._dynamo",
    ]
    assert private_imports("from timm.models import save_for_hf\nfrom locatdino.x._y import z\n", "m") == []
    assert private_writes("saved._metadata = {}\n", "locatdino.ssl.export.files") == []  # OTHER_OBJECTS
    assert private_writes("self._x = 1\ncls._y: int = 2\nx.__doc__ = ''\ny = x._z\nsetattr(self, '_x', 1)\n", "m") == []
    source = (
        "import argparse\nfrom lightning.pytorch.cli import LightningCLI\n"
        "class Formatter(argparse.ArgumentDefaultsHelpFormatter):\n"
        "    def _get_help_string(self, action):\n        return action.help\n"
        "    def _mine(self):\n        pass\n"
        "class CLI(LightningCLI):\n    def _run_subcommand(self, subcommand):\n        pass\n"
        "    def before_fit(self):\n        pass\n"
    )
    assert private_overrides(source, planted(source)) == [
        "planted.Formatter._get_help_string overrides argparse.ArgumentDefaultsHelpFormatter._get_help_string",
        "planted.CLI._run_subcommand overrides lightning.pytorch.cli.LightningCLI._run_subcommand",
    ]
    source = (
        "from lightning.pytorch.strategies import FSDPStrategy\n"
        "class Mine(FSDPStrategy):\n"
        "    def follow(self):\n        self._activation_checkpointing_kwargs = {}\n        self._mine = 1\n"
    )
    assert upstream_owned_writes(source, planted(source)) == [
        "planted.Mine sets self._activation_checkpointing_kwargs, which "
        "lightning.pytorch.strategies.fsdp.FSDPStrategy uses"
    ]  # the project's own strategy is ALLOWED_WRITES, by its module's name


def test_no_private_attribute_of_another_object_is_written():
    modules = package_modules()
    assert len(modules) > 150
    assert [found for module, path in modules for found in private_writes(path.read_text(), module)] == []


def test_no_private_module_of_another_package_is_imported():
    assert [found for module, path in package_modules() for found in private_imports(path.read_text(), module)] == []


def test_no_private_attribute_an_upstream_base_uses_is_written_through_self():
    checked = [(name, path.read_text()) for name, path in package_modules()]
    checked = [  # a class with an upstream base imports it (faiss's modules set KMP_* on import: not read)
        (name, source)
        for name, source in checked
        if ("self._" in source or "cls._" in source) and any(up in source for up in UPSTREAM)
    ]
    assert len(checked) >= 10
    found = [hit for name, source in checked for hit in upstream_owned_writes(source, importlib.import_module(name))]
    assert found == []


def test_no_private_upstream_method_is_overridden():
    checked = [(name, path.read_text()) for name, path in package_modules()]
    checked = [(name, source) for name, source in checked if defines_private_methods(source)]
    assert len(checked) >= 10  # the classes with private helpers of their own are read too
    assert [
        found for name, source in checked for found in private_overrides(source, importlib.import_module(name))
    ] == []


def test_the_allowed_override_still_exists_upstream():
    """Fails when Lightning renames or stops calling the one private method overridden, or stops
    reading the one private attribute written."""
    assert "_setup_model" in vars(FSDPStrategy)
    assert "self._setup_model(" in inspect.getsource(FSDPStrategy.setup)
    assert "self._activation_checkpointing_kwargs" in inspect.getsource(FSDPStrategy._setup_model)
