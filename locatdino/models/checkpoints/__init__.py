"""Backbone checkpoints: every supported container read, converted and loaded (docs/checkpoints.md), a
one-line reason when a file does not fit, and position embeddings at another grid (docs/checkpoints.md)."""

from locatdino.models.checkpoints.contents import extract_backbone, load_backbone_state_dict, load_checkpoint
from locatdino.models.checkpoints.loading import convert_state_dict, create_backbone
from locatdino.models.checkpoints.pos_embed import (
    POS_EMBED_RULES,
    dino_interpolate_pos_embed,
    position_rule,
    set_pos_embed_rule,
)

__all__ = [
    "POS_EMBED_RULES",
    "convert_state_dict",
    "create_backbone",
    "dino_interpolate_pos_embed",
    "extract_backbone",
    "load_backbone_state_dict",
    "load_checkpoint",
    "position_rule",
    "set_pos_embed_rule",
]
