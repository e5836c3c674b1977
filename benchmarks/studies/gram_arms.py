"""The arms of the Gram and distillation study, shared by its CPU run (``gram_distill.py``) and its
GPU run (``gpu_gram_distill.py``): which backbone and recipe each arm trains, whether it adds
Gram anchoring and with which schedule, and which arms its table compares. Nothing heavy is
imported here, so the GPU run can read them on a machine without the ``fit`` command's packages.
"""

from __future__ import annotations

# arm -> (backbone: a key of the studies' BACKBONES, recipe, uses Gram anchoring); the distill arm's
# teacher is the dino arm's run unless a release is given
ARMS: dict[str, tuple[str, str, bool]] = {
    "dino": ("vit", "dino_tiny_cpu", False),
    "dino_gram": ("vit", "dino_tiny_cpu", True),
    "locat": ("locatvit", "dino_tiny_cpu", False),
    "locat_gram": ("locatvit", "dino_tiny_cpu", True),
    "distill": ("locatvit", "distill_tiny_cpu", False),
}
# paired differences of the tables: (label, arm A, arm B); "random" is the arm's own random init
PAIRS = [
    *[(f"{arm} − random init", arm, "random") for arm in ARMS],
    ("dino_gram − dino", "dino_gram", "dino"),
    ("locat_gram − locat", "locat_gram", "locat"),
    ("locat − dino", "locat", "dino"),
    ("locat_gram − dino_gram", "locat_gram", "dino_gram"),
    ("distill − locat", "distill", "locat"),
]


def gram_block(steps: int) -> dict[str, int]:
    """The Gram block of ``configs/dino_tiny_cpu.yaml`` scaled to a run of ``steps``: the Gram
    teacher is the EMA teacher of the middle step, refreshed after every quarter from 3/4 on
    (the loss weight stays DINOv3's 1.0, the block's default)."""
    quarter = max(steps // 4, 1)
    return {"it_load_ema_teacher": steps // 2, "update_frequency": quarter, "it_first_update": 3 * quarter}
