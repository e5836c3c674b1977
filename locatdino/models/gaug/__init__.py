"""GAug: the Gaussian locality bias on every attention's logits (docs/locatvit.md).

``attention`` is the timm ``attn_layer``; ``locality_bias`` predicts the per-query Gaussian
profiles; the three kernels add them to the logits (``separable_bias_attention`` on CPU,
``flex_bias_attention`` through FlexAttention on CUDA, SDPA with ``bias_mask`` otherwise);
``patch_grid`` hands the input's grid from the patch embedding to every layer.
"""

from locatdino.models.gaug.attention import GAugAttention
from locatdino.models.gaug.locality_bias import GaussianLocalityBias

__all__ = ["GAugAttention", "GaussianLocalityBias"]
