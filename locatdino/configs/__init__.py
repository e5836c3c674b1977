"""The ``locatdino fit`` recipes, shipped inside the package so a wheel install has them too.

``default.yaml`` holds every key and is always loaded first; each other file is a recipe holding
only what changes. One recipe per objective and scale, named ``<objective>_<scale>_<strategy>``
(``dino_tiny_cpu``, ``sup_small_ddp``, ``dino_large_fsdp``, ...); its backbone is the vanilla ViT
and ``--model.backbone`` switches it (``locatvit_tiny_patch8_224``, ``locatvit_small_patch16_224``).
A checkout also shows them as ``configs/`` at the repository root (a symlink to this folder), so
``--config configs/<recipe>.yaml`` works there as everywhere else.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


def recipes() -> list[str]:
    """Names of the shipped recipes (``default`` excluded)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "default")


def resolve_recipe(value: str) -> str:
    """A ``--config`` value as a file: an existing path as given; else a recipe name (``dino_tiny_cpu``,
    ``dino_tiny_cpu.yaml`` or ``configs/dino_tiny_cpu.yaml``, as README writes it) from the package."""
    path = Path(value)
    if path.is_file() or path.parent not in (Path("."), Path("configs")):
        return value
    yaml_file = path.suffix in (".yaml", ".yml")
    shipped = CONFIG_DIR / (path.name if yaml_file else f"{path.name}.yaml")
    return str(shipped) if shipped.is_file() else value
