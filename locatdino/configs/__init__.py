"""The ``locatdino fit`` recipes, shipped inside the package so a wheel install has them too.

``default.yaml`` holds every key and is always loaded first; each other file is a recipe holding
only what changes. A checkout also shows them as ``configs/`` at the repository root (a symlink
to this folder), so ``--config configs/<recipe>.yaml`` works there as everywhere else.
"""

from __future__ import annotations

from pathlib import Path

from locatdino.common.errors import UsageError

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
# recipes renamed so that every name says its objective (dino_, ibot_, sup_): earlier name -> name
RENAMED = {"tiny_vit": "dino_tiny_vit", "tiny_locatvit": "dino_tiny_locatvit"}


def recipes() -> list[str]:
    """Names of the shipped recipes (``default`` excluded)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "default")


def resolve_recipe(value: str, option: str = "--config") -> str:
    """A ``--config`` value as a file: an existing path as given; else a recipe name (``dino_tiny_vit``,
    ``dino_tiny_vit.yaml`` or ``configs/dino_tiny_vit.yaml``, as README writes it) from the package.
    A recipe's earlier name (:data:`RENAMED`) is a :class:`UsageError` naming the new one."""
    path = Path(value)
    if path.is_file() or path.parent not in (Path("."), Path("configs")):
        return value
    yaml_file = path.suffix in (".yaml", ".yml")
    shipped = CONFIG_DIR / (path.name if yaml_file else f"{path.name}.yaml")
    stem = path.stem if yaml_file else path.name
    if not shipped.is_file() and stem in RENAMED:
        raise UsageError(f"{option} {value} was renamed {path.parent / path.name.replace(stem, RENAMED[stem], 1)}")
    return str(shipped) if shipped.is_file() else value
