"""DINOv2's linear segmentation head on frozen ViT tokens (``linprobe --variant dinov2``, docs/evaluation.md).

DINOv2 (facebookresearch/dinov2 ``dinov2/eval/segmentation/models/decode_heads/linear_head.py``,
``BNHead``; DINOv3's ``dinov3/eval/segmentation/models/heads/linear_head.py``, ``LinearHead``) trains,
on the patch tokens of the backbone's last block or of its last 4 blocks, each through the
backbone's final norm (``get_intermediate_layers(norm=True)``), a BatchNorm over the channels
(SyncBatchNorm across the GPUs there; one process here, so plain :class:`~torch.nn.BatchNorm2d`) and
a 1×1 convolution to the classes. With 4 blocks the maps are concatenated along the channels in
block order (``out_indices`` ``[d−4, d−3, d−2, d−1]``, the earliest block's channels first). The
classifier starts at ``N(0, 0.01)`` with a zero bias (MMSegmentation's ``conv_seg``); dropout is 0.

Only a ViT has per-block patch tokens of one width: a Swin, a network-free baseline or a ViT with
fewer blocks than the setting takes is refused before any work (:func:`check_blocks`).
"""

from __future__ import annotations

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from locatdino.common.errors import UserError
from locatdino.evaluation.augment import normalize
from locatdino.evaluation.features import FeatureExtractor, eval_mode
from locatdino.evaluation.linprobe.head import bilinear_resize
from locatdino.evaluation.precision import autocast
from locatdino.models.token_grid import token_grid


class BatchNormLinearHead(nn.Module):
    """``features [B, D·k, h, w] → logits [B, C, H, W]``: BatchNorm then a 1×1 conv (``H, W = size``,
    or ``h, w`` when None), the logits upsampled bilinearly as the paper's head does."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(in_dim)
        self.classifier = nn.Conv2d(in_dim, num_classes, kernel_size=1)
        nn.init.normal_(self.classifier.weight, std=0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, features: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        logits = self.classifier(self.norm(features))
        return logits if size is None else bilinear_resize(logits, size)


def block_indices(depth: int, last: int, blocks: int) -> list[int]:
    """The ``blocks`` block indices ending at block ``last`` (negative from the end), in order."""
    end = last % depth
    return list(range(end - blocks + 1, end + 1))


def check_blocks(model: nn.Module, name: str, variant: str, blocks: int, layer: int) -> None:
    """:class:`UserError` (one line) unless ``model`` is a ViT with ``blocks`` blocks ending at ``layer``."""
    if not isinstance(model, VisionTransformer):
        raise UserError(
            f"--variant {variant} trains on a ViT's per-block patch tokens: {name} is a {type(model).__name__} "
            "(use --variant paper)"
        )
    depth = len(model.blocks)
    if block_indices(depth, layer, blocks)[0] < 0:
        raise UserError(
            f"--variant {variant} takes the last {blocks} blocks up to --layer {layer}, but {name} has "
            f"only {(layer % depth) + 1} block{'s' * (layer % depth > 0)} there"
        )


class BlockTokens(FeatureExtractor):
    """Patch tokens of ``blocks`` consecutive blocks ending at ``layer``, each through the final
    norm (unless ``norm`` is False), concatenated along the channels in block order: ``images uint8
    [B, 3, H, W] → [B, h, w, D·blocks]`` on the model's device (one forward, stopped after the last)."""

    def __init__(self, model: nn.Module, blocks: int, layer: int = -1, norm: bool = True, precision: str = "fp32"):
        super().__init__(model, layer=layer, norm=norm, precision=precision, l2_normalize=False, to_cpu=False)
        self.indices = block_indices(len(model.blocks), layer, blocks)
        self.dim *= blocks

    def __call__(self, images: Tensor) -> Tensor:
        x = normalize(images.to(self.device, non_blocking=True))
        h, w = token_grid(self.model, tuple(x.shape[-2:]))
        with eval_mode(self.model), torch.inference_mode(), autocast(self.precision, self.device):
            tokens = self.model.forward_intermediates(
                x, indices=self.indices, norm=self.norm, stop_early=True, output_fmt="NLC", intermediates_only=True
            )
            feats = torch.cat(tokens, dim=-1).float()
            if not torch.isfinite(feats).all():
                raise UserError(f"the encoder's tokens (blocks {self.indices}) are not finite in {self.precision}")
            return feats.reshape(feats.shape[0], h, w, feats.shape[-1])
