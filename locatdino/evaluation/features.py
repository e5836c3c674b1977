"""Dense patch features of a frozen timm ViT / LocAtViT (or Swin / LocAtSwin) for evaluation (Hummingbird, the dense
linear probe; docs/locatvit.md).

The features are the patch tokens of one block — by default the last block, before the final
norm and without PRR, the reference choice — from ``locatdino.models.dense_features``, computed
under ``torch.inference_mode`` in the precision that is fastest on the device unless told otherwise
(``locatdino.evaluation.precision``: bf16 autocast, int8 Linear layers or fp32) and L2-normalised so
inner product = cosine similarity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from locatdino.common.errors import UserError
from locatdino.evaluation.augment import normalize
from locatdino.evaluation.precision import autocast, encoder_for
from locatdino.models import create_backbone, dense_features
from locatdino.models.baselines import PatchBaseline
from locatdino.models.dense_features import feature_map


def load_backbone(name: str, checkpoint: str | None = None, pos_embed: str = "auto") -> nn.Module:
    """A frozen backbone by timm name, weights from ``checkpoint`` (any format
    ``create_backbone`` understands) or random init when None. Built with
    ``dynamic_img_size=True`` so it runs at any eval size without changing the model (LocAtViT's
    GAug constants depend on the build grid, so the build size must stay the training size);
    ``pos_embed`` picks how position embeddings are resampled there (``create_backbone``)."""
    model = create_backbone(name, checkpoint, pos_embed=pos_embed, dynamic_img_size=True)
    return model.eval().requires_grad_(False)


def check_layer(depth: int, layer: int, model_name: str) -> None:
    """:class:`UserError` unless ``layer`` indexes one of the ``depth`` blocks of ``model_name``
    (``-depth .. depth - 1``): checked when the model is built, before any feature is computed."""
    if not -depth <= layer < depth:
        raise UserError(
            f"--layer {layer}: {model_name} has {depth} blocks (use 0 to {depth - 1}, or -1 to -{depth} from the end)"
        )


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode for the block and restore its previous mode (the monitor
    evaluates a teacher in the middle of training)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class FeatureExtractor:
    """``images uint8 [B, 3, S, S]`` → L2-normalised float32 patch features ``[B, h, w, D]`` on CPU
    (raw tokens on the model's device with ``l2_normalize=False, to_cpu=False``: the dense linear
    probe trains on them, docs/evaluation.md).

    Args:
        model: a timm ``VisionTransformer`` (vanilla or LocAtViT) or ``SwinTransformer`` (vanilla or
            LocAtSwin: a stage's map, ``locatdino.models.dense_features``), used frozen, or a network-free
            :class:`~locatdino.models.baselines.PatchBaseline` (on the CPU unless ``device`` says
            otherwise; always fp32: it has no weights whose arithmetic could be chosen).
        layer: block (Swin: stage) index (negative from the end); ``-1`` is the last.
        norm: apply the final norm (the reference does not).
        prr: apply PRR before taking the patch tokens (the reference does not).
        precision: ``"auto"``, ``"fp32"``, ``"bf16"`` (autocast) or ``"int8"`` (a copy of the model
            with int8 Linear layers, CPU only); ``auto`` is resolved for ``device`` at
            construction and ``self.precision`` says what was chosen.
        device: where the forward runs; default the model's device.
        l2_normalize: unit-length features (cosine similarity = inner product, for retrieval).
        to_cpu: return the features on the CPU (else on ``device``).
    """

    def __init__(
        self,
        model: nn.Module,
        layer: int = -1,
        norm: bool = False,
        prr: bool = False,
        precision: str = "fp32",
        device: torch.device | str | None = None,
        l2_normalize: bool = True,
        to_cpu: bool = True,
    ):
        baseline = isinstance(model, PatchBaseline)
        if device is None:
            device = "cpu" if baseline else next(model.parameters()).device
        self.device = torch.device(device)
        self.model, self.precision = (model, "fp32") if baseline else encoder_for(model, precision, self.device)
        self.layer, self.norm, self.prr = layer, norm, prr
        self.l2_normalize, self.to_cpu = l2_normalize, to_cpu
        self.patch_size, self.dim = feature_map(model, layer)  # px per feature and its width

    def grid(self, size: int) -> int:
        """Patch-grid side for square inputs of ``size`` px."""
        if size % self.patch_size:
            raise ValueError(f"input size {size} is not a multiple of the patch size {self.patch_size}")
        return size // self.patch_size

    def __call__(self, images: Tensor) -> Tensor:
        x = normalize(images.to(self.device, non_blocking=True))
        with eval_mode(self.model), torch.inference_mode(), autocast(self.precision, self.device):
            feats = dense_features(self.model, x, layer=self.layer, norm=self.norm, prr=self.prr, output_fmt="NHWC")
            if not torch.isfinite(feats).all():  # else NaN neighbours and labels get scored as an mIoU
                raise UserError(
                    f"the encoder's patch features (block {self.layer}) are not finite in {self.precision}: "
                    "its weights overflow (a diverged run, or a checkpoint with huge values?); nothing "
                    "was scored"
                )
            feats = F.normalize(feats.float(), dim=-1) if self.l2_normalize else feats.float()
            return feats.cpu() if self.to_cpu else feats
