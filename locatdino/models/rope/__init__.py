"""LocAt on RoPE ViTs (timm's ``Eva``: DINOv3, EVA-02, ``vit_*_rope_*``; docs/locatvit.md): GAug on
the RoPE attention (``attention``) and the timm registry entries ``locatvit_{tiny,base}_rope_mixed``
and ``locatvit_*_patch16_dinov3[_qkvb]`` (``entries``)."""

from locatdino.models.rope.attention import GAugAttentionRope, GAugEvaAttention, add_gaug_to_blocks

__all__ = ["GAugAttentionRope", "GAugEvaAttention", "add_gaug_to_blocks"]
