"""LocAtViT backbone: the timm registry entries and ``locatify`` (``locatvit``, ``locatify``),
GAug (``gaug/``), checkpoints (``checkpoints/``: loading, mismatch messages, position embeddings)
and dense features (``dense_features``). PRR is timm's own ``global_pool='prr'``.

Importing this package registers ``locatvit_{tiny,small,base}_patch16_224`` and ``locatvit_tiny_patch8_224``
in timm's model registry (and the earlier names ``locatvit_{tiny,small,base}`` as timm deprecations),
LocAt on RoPE ViTs (``rope/``): ``locatvit_{tiny,base}_rope_mixed`` and
``locatvit_{small,small_plus,base,large}_patch16_dinov3[_qkvb]``, and LocAt on Swin, ``locatswin_{tiny,base}``
(``swin/``).
"""

from locatdino.models import locatvit  # noqa: F401  (registers the timm entries)
from locatdino.models.checkpoints import (
    POS_EMBED_RULES,
    convert_state_dict,
    create_backbone,
    dino_interpolate_pos_embed,
    extract_backbone,
    load_backbone_state_dict,
    load_checkpoint,
    position_rule,
    set_pos_embed_rule,
)
from locatdino.models.dense_features import dense_features
from locatdino.models.gaug import GAugAttention, GaussianLocalityBias
from locatdino.models.locatify import locatify
from locatdino.models.rope import entries  # noqa: F401  (registers the RoPE LocAt entries)
from locatdino.models.swin import locatswin  # noqa: F401  (registers the timm entries)

__all__ = [
    "POS_EMBED_RULES",
    "GAugAttention",
    "GaussianLocalityBias",
    "convert_state_dict",
    "create_backbone",
    "dense_features",
    "dino_interpolate_pos_embed",
    "extract_backbone",
    "load_backbone_state_dict",
    "load_checkpoint",
    "locatify",
    "position_rule",
    "set_pos_embed_rule",
]
