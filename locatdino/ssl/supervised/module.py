"""Supervised pretraining: image classification with timm's DeiT recipe (docs/pretraining.md), as a LightningModule.

LocAtViT's headline results are for ViTs trained to classify images and then evaluated frozen
for segmentation. The recipe is timm's ``train.py`` with DeiT settings, assembled from timm's own
parts: Mixup / CutMix with label smoothing (``timm.data.Mixup``), the matching loss
(``SoftTargetCrossEntropy``, ``LabelSmoothingCrossEntropy`` or, as ``--bce-loss``,
``BinaryCrossEntropy``), AdamW with no decay on biases, norms and position/class embeddings
(``timm.optim.create_optimizer_v2``), warm-up + cosine per iteration (``timm.scheduler``), drop
path in the backbone. Augmentation is in the data (``locatdino.data.ClassificationTransform``);
AMP and gradient clipping are the Trainer's (``precision``, ``gradient_clip_val``).
"""

from __future__ import annotations

from typing import Any

import torch
from timm.data import Mixup
from timm.layers import trunc_normal_
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch import Tensor, nn
from torchmetrics import MeanMetric

from locatdino.common.errors import UserError
from locatdino.models import create_backbone
from locatdino.ssl.objective.base import PretrainingObjective
from locatdino.ssl.objective.schedules import scaled_lr

SUPERVISED_REFERENCE_BATCH = 512  # lr = lr × global batch / 512 (timm's lr_base_size, DeiT)


class Classifier(nn.Module):
    """A backbone's image embedding → a linear classifier.

    The embedding is ``backbone(x)`` of a ``num_classes=0`` timm model: the class token after the
    final norm, PRR-pooled for LocAtViT (timm ``global_pool='prr'``).
    """

    def __init__(self, backbone: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.num_features, num_classes)
        trunc_normal_(self.head.weight, std=0.02)  # timm's ViT init of linear layers
        nn.init.zeros_(self.head.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))

    def no_weight_decay(self) -> set[str]:
        """The backbone's own exemptions (position embedding, class token, ...) for timm's optimizer
        factory, which also exempts every bias and 1-D parameter."""
        return {f"backbone.{name}" for name in getattr(self.backbone, "no_weight_decay", set)()}


class SupervisedModule(PretrainingObjective):
    """Classification pretraining of any timm backbone (LocAtViT or vanilla ViT).

    ``training_step`` takes the batches of ``locatdino.data.LabelledShardDataModule``:
    ``batch["image"]`` ``[B, 3, H, W]`` and ``batch["target"]`` ``[B]`` (class indices) or
    ``[B, C]`` (multi-hot; needs ``bce_loss`` and no Mixup/CutMix, which mix single labels).
    ``validation_step`` logs ``val/top1`` (percent; multi-label: the top class is one of the image's).

    Args:
        backbone: timm model name (``vit_small_patch16_224``, ``locatvit_small_patch16_224``, …).
        backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``global_pool``, …);
            ``num_classes=0`` and ``dynamic_img_size=True`` are the defaults.
        backbone_checkpoint: optional weights to start from, any format ``locatdino.models`` reads.
        num_classes: classes of the linear classifier (checked against the data's ``index.json``).
        drop_path_rate: stochastic depth of the backbone (DeiT: 0.1 tiny, 0.2 small, 0.4 base).
        batch_size: images per rank per step (linked from ``data.init_args.batch_size``).
        opt: timm optimizer name (``adamw``).
        lr: peak learning rate per 512 images (scaled by the global batch / 512).
        weight_decay: decoupled weight decay (not on biases, 1-D parameters, embeddings).
        sched: timm scheduler name (``cosine``), stepped every optimizer step.
        min_lr: learning rate at the end of the schedule.
        warmup_lr: learning rate at step 0, warmed up linearly to the peak.
        warmup_epochs: epochs of the warm-up.
        mixup_alpha: Mixup's Beta(α, α) (``timm.data.Mixup``; 0 with ``cutmix_alpha`` 0: no mixing).
        cutmix_alpha: CutMix's Beta(α, α).
        mixup_prob: probability of mixing a batch.
        mixup_switch_prob: probability of CutMix instead of Mixup when both are on.
        mixup_mode: ``batch``, ``pair`` or ``elem`` (timm's: one λ per batch, pair or image).
        label_smoothing: smoothing of the targets (inside Mixup's soft targets when it is on).
        bce_loss: binary cross-entropy per class (timm's ``--bce-loss``) instead of softmax CE.
        bce_target_thresh: binarise soft targets above this value for the BCE (``None``: keep soft).
        grad_checkpointing: the backbone's blocks recompute their activations in the backward
            instead of keeping them (less memory, about one more forward of compute).
        compile: ``torch.compile`` the backbone (in place: checkpoints keep their keys).
    """

    evaluated_network = "classifier"

    def __init__(
        self,
        backbone: str = "vit_small_patch16_224",
        backbone_kwargs: dict[str, Any] | None = None,
        backbone_checkpoint: str | None = None,
        num_classes: int = 1000,
        drop_path_rate: float = 0.1,
        batch_size: int = 64,
        opt: str = "adamw",
        lr: float = 5e-4,
        weight_decay: float = 0.05,
        sched: str = "cosine",
        min_lr: float = 1e-5,
        warmup_lr: float = 1e-6,
        warmup_epochs: float = 20.0,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        mixup_mode: str = "batch",
        label_smoothing: float = 0.1,
        bce_loss: bool = False,
        bce_target_thresh: float | None = None,
        grad_checkpointing: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.classifier = Classifier(
            create_backbone(
                backbone,
                backbone_checkpoint,
                pos_embed="timm",
                drop_path_rate=drop_path_rate,
                **(backbone_kwargs or {}),
            ),
            num_classes,
        )
        self.prepare_backbones(self.classifier.backbone)
        self.mixup = (
            Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                prob=mixup_prob,
                switch_prob=mixup_switch_prob,
                mode=mixup_mode,
                label_smoothing=label_smoothing,
                num_classes=num_classes,
            )
            if mixup_alpha > 0 or cutmix_alpha > 0
            else None
        )
        self.criterion = self._criterion()
        self.val_top1 = MeanMetric()

    def _criterion(self) -> nn.Module:
        """timm ``train.py``'s choice of loss for these settings."""
        h = self.hparams
        if h.bce_loss:
            smoothing = 0.0 if self.mixup is not None else h.label_smoothing  # Mixup smooths itself
            return BinaryCrossEntropy(smoothing=smoothing, target_threshold=h.bce_target_thresh)
        if self.mixup is not None:
            return SoftTargetCrossEntropy()
        if h.label_smoothing:
            return LabelSmoothingCrossEntropy(smoothing=h.label_smoothing)
        return nn.CrossEntropyLoss()

    def forward(self, x: Tensor) -> Tensor:
        """Class logits ``[B, num_classes]`` of images ``[B, 3, H, W]``."""
        return self.classifier(x)

    def setup(self, stage: str) -> None:
        """The data's labels must fit the classifier and the loss (one-line errors naming the key)."""
        super().setup(stage)
        data = self.trainer.datamodule if self.trainer is not None else None
        if data is None or not hasattr(data, "num_classes"):
            return
        if data.num_classes != self.hparams.num_classes:
            raise UserError(
                f"model.init_args.num_classes: {self.hparams.num_classes}, but the shards' index.json "
                f"lists {data.num_classes} classes"
            )
        if data.multilabel and (not self.hparams.bce_loss or self.mixup is not None):
            raise UserError(
                "data.init_args.labels: multi-label targets need model.init_args.bce_loss true and "
                "mixup_alpha = cutmix_alpha = 0 (timm's Mixup mixes single labels)"
            )

    # ------------------------------------------------------------------ training

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        images, target = batch["image"], batch["target"]
        self.check_batch_size(images.shape[0])
        if self.mixup is not None:
            images, target = self.mixup(images, target)
        loss = self.criterion(self.classifier(images), target)
        if self.trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss)), all=False):
            raise self.nonfinite_loss_error(loss, "supervised")
        self.log("train/loss", loss, prog_bar=True)
        every = self.trainer.log_every_n_steps
        if every and (self.trainer.global_step + 1) % every == 0:
            self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        top = self.classifier(batch["image"]).argmax(-1)
        target = batch["target"]
        hit = target.gather(1, top[:, None])[:, 0] > 0 if target.ndim == 2 else top == target
        self.val_top1.update(100.0 * hit.float())
        self.log("val/top1", self.val_top1, on_step=False, on_epoch=True, prog_bar=True)

    # ------------------------------------------------------------------ optimiser and schedule

    def configure_optimizers(self) -> dict[str, Any]:
        length = self.run_length()
        h = self.hparams
        optimizer = create_optimizer_v2(
            self.classifier,
            opt=h.opt,
            weight_decay=h.weight_decay,
            lr=scaled_lr(h.lr, length.global_batch, SUPERVISED_REFERENCE_BATCH),
        )
        # one scheduler "epoch" per optimizer step: warm-up and decay per iteration, as timm's
        # step_on_epochs=False does (its own epochs would need whole-epoch runs)
        scheduler, _ = create_scheduler_v2(
            optimizer,
            sched=h.sched,
            num_epochs=length.total_steps,
            min_lr=h.min_lr,
            warmup_lr=h.warmup_lr,
            warmup_epochs=int(round(h.warmup_epochs * length.steps_per_epoch)),
            cooldown_epochs=0,
            step_on_epochs=False,
            updates_per_epoch=1,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric: Any | None) -> None:
        """timm schedulers are stepped with the number of optimizer steps done (resume-safe)."""
        scheduler.step_update(num_updates=self.trainer.global_step)
