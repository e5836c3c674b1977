"""LocAtViT backbone: GAug attention, PRR pooling, timm registry entries, checkpoint loading.

Importing this package registers ``locatvit_{tiny,small,base}_patch16_224`` (and the aliases
``locatvit_{tiny,small,base}``) in timm's model registry.
"""

from locatdino.models import locatvit  # noqa: F401  (registers the timm entries)
from locatdino.models.checkpoint import (
    convert_state_dict,
    create_backbone,
    extract_backbone,
    load_backbone_state_dict,
    load_checkpoint,
)
from locatdino.models.dense_features import dense_features
from locatdino.models.gaug_attention import GAugAttention
from locatdino.models.locality_bias import GaussianLocalityBias
from locatdino.models.locatify import locatify
from locatdino.models.pos_embed import POS_EMBED_RULES, dino_interpolate_pos_embed, set_pos_embed_rule

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
    "set_pos_embed_rule",
]
