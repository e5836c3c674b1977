"""LocAt on Swin (docs/locatvit.md): GAug over each window's grid (``window_attention``), PRR on the last
stage's map and the ``locatswin_{tiny,base}`` timm entries (``locatswin``)."""

from locatdino.models.swin.locatswin import LocAtSwin, locatify_swin
from locatdino.models.swin.window_attention import LocAtWindowAttention

__all__ = ["LocAtSwin", "LocAtWindowAttention", "locatify_swin"]
