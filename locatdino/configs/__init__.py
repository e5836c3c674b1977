"""The ``locatdino fit`` recipes, shipped inside the package so a wheel install has them too.

``default.yaml`` holds every key and is always loaded first; each other file is a recipe holding
only what changes. A checkout also shows them as ``configs/`` at the repository root (a symlink
to this folder), so ``--config configs/<recipe>.yaml`` works there as everywhere else.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


def recipes() -> list[str]:
    """Names of the shipped recipes (``default`` excluded)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "default")


def resolve_recipe(value: str) -> str:
    """A ``--config`` value as a file: an existing path as given; else a recipe name (``tiny_vit``,
    ``tiny_vit.yaml`` or ``configs/tiny_vit.yaml``, as README writes it) from the package."""
    path = Path(value)
    if path.is_file() or path.parent not in (Path("."), Path("configs")):
        return value
    shipped = CONFIG_DIR / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    return str(shipped) if shipped.is_file() else value
