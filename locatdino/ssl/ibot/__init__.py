"""iBOT: DINO plus masked-patch prediction (Zhou et al. 2022; the DINOv2 recipe's patch loss; docs/pretraining.md).

One concept per file: the block-wise masks (``masking``), the learned mask token and its hook on
the patch embedding (``mask_token``), the masked-patch loss (``patch_loss``) with Sinkhorn–Knopp
targets as an option (``sinkhorn``), the KoLeo regulariser (``koleo_loss``) and the LightningModule
(``module``), which extends :class:`~locatdino.ssl.DINOModule`.
"""

from locatdino.ssl.ibot.koleo_loss import KoLeoLoss
from locatdino.ssl.ibot.mask_token import MaskToken
from locatdino.ssl.ibot.masking import BlockMasking, mask_rng
from locatdino.ssl.ibot.module import IBOTModule
from locatdino.ssl.ibot.patch_loss import IBOTPatchLoss
from locatdino.ssl.ibot.sinkhorn import sinkhorn_knopp

__all__ = ["BlockMasking", "IBOTModule", "IBOTPatchLoss", "KoLeoLoss", "MaskToken", "mask_rng", "sinkhorn_knopp"]
