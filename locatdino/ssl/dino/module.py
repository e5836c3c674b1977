"""DINO self-distillation as a LightningModule (Caron et al., ICCV 2021; docs/pretraining.md)."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn
from timm.models import split_model_name_tag
from timm.models.swin_transformer import SwinTransformer
from torch import Tensor, nn

from locatdino.common.errors import UserError
from locatdino.models import create_backbone
from locatdino.ssl.dino.loss import DINOLoss
from locatdino.ssl.objective.base import PretrainingObjective
from locatdino.ssl.objective.collapse import ENTROPY_KEY, MARGINAL_ENTROPY_KEY, teacher_entropies
from locatdino.ssl.objective.final_tokens import FinalTokens
from locatdino.ssl.objective.grad_clip import clip_grad_per_tensor_
from locatdino.ssl.objective.gram_anchor import GramAnchor, GramOptions
from locatdino.ssl.objective.head import DINOHead
from locatdino.ssl.objective.schedules import DINOSchedules
from locatdino.ssl.objective.start_weights import load_start_weights, start_line
from locatdino.ssl.objective.teacher_update import update_teacher

# Name segments FSDP and activation checkpointing insert into parameter names ("blocks.0.
# _checkpoint_wrapped_module.norm1.weight"); torch's own stripper is private.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


@dataclass
class StepLosses:
    """What one micro-batch's objective computed: the ``loss`` to minimise, the teacher's class
    targets (their entropies are logged; ``None`` for an objective without them), each centred
    loss with the teacher output that moves its centre (applied once per optimizer step), and
    ``parts`` logged beside the total."""

    loss: Tensor
    teacher_probs: Tensor | None
    center_inputs: list[tuple[DINOLoss, Tensor]]
    parts: dict[str, Tensor | float] = field(default_factory=dict)


def unwrapped_name(name: str) -> str:
    """A parameter name as in the unwrapped model, so per-name decisions survive any wrapping."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class DINOModule(PretrainingObjective):
    """Student–teacher DINO pretraining of any timm backbone (LocAtViT or vanilla ViT).

    ``self.student`` and ``self.teacher`` are ``nn.ModuleDict({"backbone", "head"})`` of the same
    shape (checkpoint keys ``student.backbone.*``, ``teacher.head.*``, …); the teacher starts as a
    copy of the student, never receives gradients and follows it by EMA after every optimizer step.
    The teacher is the evaluated network (``eval_backbone``, what ``export`` writes). The image
    embedding is ``backbone(x)`` with ``num_classes=0``: the class token after the final norm (after
    PRR for LocAtViT).

    ``training_step`` takes the multi-crop batch of ``locatdino.data.collate_multicrop``:
    ``batch["global"]`` ``[V_g, B, 3, H, W]`` and ``batch["local"]`` ``[V_l, B, 3, h, w]``
    (``V_l`` may be 0). Crops of one resolution go through the backbone in one forward; the
    teacher sees the global crops, the student all of them.

    Why automatic optimisation: Lightning unscales 16-mixed gradients *before* calling
    :meth:`configure_gradient_clipping`, which is where the per-tensor clipping, the last-layer
    freeze and the skipping of a step with a non-finite loss go (gradients dropped on every rank,
    so AdamW and the grad scaler leave the weights alone); the per-step lr / weight decay are
    written into the optimizer in :meth:`optimizer_step` and the EMA runs right after it. Manual
    optimisation would re-implement all of that, and gradient accumulation, for nothing.

    Args:
        backbone: timm model name (``vit_small_patch16_224``, ``locatvit_small_patch16_224``, …).
        backbone_kwargs: extra ``timm.create_model`` arguments (``img_size``, ``depth``, …);
            ``num_classes=0`` and ``dynamic_img_size=True`` are the defaults.
        backbone_checkpoint: optional file to start a new run from: a backbone in any format
            ``locatdino.models.create_backbone`` reads (student and teacher alike, heads initialised),
            or a full DINO / ``fit`` training checkpoint (each network's backbone and head, the loss
            centre); :mod:`locatdino.ssl.objective.start_weights`. A file without GAug (a vanilla
            release, DINOv3's included) starts a LocAt backbone with GAug freshly initialised.
        drop_path_rate: stochastic depth of the student (the teacher has none).
        out_dim: ``K``, the prototypes of the head's last layer (65536 in the reference; 1k-8k
            converge faster on small data).
        hidden_dim: width of the head's MLP (2048).
        bottleneck_dim: the head's L2-normalised bottleneck before the last layer (256).
        head_layers: linear layers of the head's MLP (3).
        use_bn_in_head: BatchNorm in the head's MLP (off in the reference).
        norm_last_layer: fix the weight-norm gain of the head's last layer to 1 (the reference
            sets it false for ViT-S/16, true for ViT-B).
        student_temp: ``τ_s``, the student's softmax temperature (0.1).
        teacher_temp: ``τ_t``, the teacher's softmax temperature after the warm-up (0.04; 0.07 in
            the long ViT-S recipe).
        warmup_teacher_temp: ``τ_t`` at step 0, linearly warmed up to ``teacher_temp``.
        warmup_teacher_temp_epochs: epochs of the teacher-temperature warm-up (0: none).
        center_momentum: EMA momentum of the centre subtracted from the teacher logits (0.9).
        batch_size: images per rank per step (linked from ``data.init_args.batch_size``); the
            peak lr is ``lr × batch_size × world_size × accumulate_grad_batches / 256``.
        lr: peak AdamW learning rate per 256 images (scaled by the global batch / 256).
        min_lr: learning rate at the end of the cosine decay.
        warmup_epochs: epochs of linear lr warm-up from 0 to the peak.
        weight_decay: AdamW weight decay at step 0 (not on biases and 1-D parameters).
        weight_decay_end: weight decay at the end of its cosine schedule.
        momentum_teacher: teacher EMA momentum at step 0.
        momentum_teacher_end: teacher EMA momentum at the end of its cosine schedule.
        clip_grad: per-parameter-tensor gradient norm bound (``None``: no clipping).
        freeze_last_layer: epochs during which the head's last layer gets no update.
        on_nonfinite: a non-finite loss (on any rank) either stops the run (``"stop"``, the
            reference; the last saved checkpoint stays the newest) or skips the step on every rank
            (``"skip"``: no weight, teacher or centre update; with gradient accumulation the whole
            optimizer step the micro-batch belongs to).
        grad_checkpointing: the student backbone's blocks recompute their activations in the
            backward instead of keeping them (less memory, about one more forward of compute;
            timm's ``set_grad_checkpointing``, per block under FSDP).
        compile: ``torch.compile`` the student and teacher backbones (in place: checkpoints keep
            their keys and resume compiled or eager); the first step of each crop size compiles.
        gram: DINOv3's Gram anchoring (``None``: off), a mapping of
            :class:`~locatdino.ssl.objective.gram_anchor.GramOptions` (``loss_weight``, ``ckpt``,
            ``it_load_ema_teacher``, ``rep_update``, ``update_frequency``, …): the Gram loss of the
            student's patch features of the global crops against a frozen Gram teacher's, weighted
            and added to the loss, logged as ``gram_loss``; the Gram teacher is saved in the
            checkpoints (``gram.teacher.backbone.*``).
    """

    evaluated_network = "teacher"
    loss_name = "DINO"  # in the messages of a non-finite loss
    # student parameters held fixed while the last layer is frozen (freeze_last_layer)
    last_layer_prefixes: tuple[str, ...] = ("head.last_layer.",)
    masks_patches = False  # whether the student's global crops are masked (Gram's tokens_used)

    def __init__(
        self,
        backbone: str = "vit_small_patch16_224",
        backbone_kwargs: dict[str, Any] | None = None,
        backbone_checkpoint: str | None = None,
        drop_path_rate: float = 0.1,
        out_dim: int = 65536,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        head_layers: int = 3,
        use_bn_in_head: bool = False,
        norm_last_layer: bool = True,
        student_temp: float = 0.1,
        teacher_temp: float = 0.04,
        warmup_teacher_temp: float = 0.04,
        warmup_teacher_temp_epochs: float = 0.0,
        center_momentum: float = 0.9,
        batch_size: int = 64,
        lr: float = 5e-4,
        min_lr: float = 1e-6,
        warmup_epochs: float = 10.0,
        weight_decay: float = 0.04,
        weight_decay_end: float = 0.4,
        momentum_teacher: float = 0.996,
        momentum_teacher_end: float = 1.0,
        clip_grad: float | None = 3.0,
        freeze_last_layer: float = 1.0,
        on_nonfinite: Literal["stop", "skip"] = "stop",
        grad_checkpointing: bool = False,
        compile: bool = False,
        gram: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        gram_options = None if gram is None else GramOptions.parse(gram)  # (its one-line errors first)
        if gram_options is not None and gram_options.tokens_used != "all" and not self.masks_patches:
            raise ValueError(
                f"model.gram.tokens_used: {type(self).__name__} masks no patches, use all "
                f"(masked / unmasked are iBOT's), got {gram_options.tokens_used!r}"
            )
        kwargs = dict(backbone_kwargs or {})
        # timm's position-embedding resampling for both (the local crops are trained with it); the
        # teacher is built without the pretrained tag a named student checkpoint may carry
        self.student = nn.ModuleDict(
            {
                "backbone": create_backbone(
                    backbone,
                    backbone_checkpoint,
                    pos_embed="timm",
                    fresh_gaug=True,  # a vanilla release continued as its LocAt version
                    drop_path_rate=drop_path_rate,
                    **kwargs,
                )
            }
        )
        if isinstance(self.student["backbone"], SwinTransformer):
            raise UserError(
                f"model.backbone {backbone}: DINO and iBOT pretrain ViTs here (the paper's DINO rows), not Swin: "
                "train a Swin with the supervised recipe (configs/sup_tiny_cpu.yaml)"
            )
        self.teacher = nn.ModuleDict(
            {
                "backbone": create_backbone(
                    split_model_name_tag(backbone)[0], pos_embed="timm", drop_path_rate=0.0, **kwargs
                )
            }
        )
        embed_dim = self.student["backbone"].num_features
        for branch in (self.student, self.teacher):
            branch["head"] = DINOHead(
                embed_dim, out_dim, hidden_dim, bottleneck_dim, head_layers, use_bn_in_head, norm_last_layer
            )
            branch.update(self.branch_extras(embed_dim))
        self.teacher.load_state_dict(self.student.state_dict())
        self.teacher.requires_grad_(False)
        self.gram: GramAnchor | None = None
        if gram_options is not None:

            def build(path: str | None) -> nn.Module:  # the teacher's architecture, from a file or not
                return create_backbone(
                    split_model_name_tag(backbone)[0], path, pos_embed="timm", drop_path_rate=0.0, **kwargs
                )

            self.gram = GramAnchor(gram_options, build, self.teacher["backbone"])
        gram_teacher = () if self.gram is None or self.gram.teacher is None else (self.gram.teacher["backbone"],)
        self.prepare_backbones(self.student["backbone"], self.teacher["backbone"], *gram_teacher)
        self._final_tokens: dict[str, FinalTokens] = {}
        if self.gram is not None:  # the patch tokens the Gram loss reads
            self.final_tokens("student")
            if self.gram.teacher is None:
                self.final_tokens("teacher")
        self.dino_loss = DINOLoss(out_dim, student_temp, center_momentum)
        self._start_weights = load_start_weights(self, backbone_checkpoint) if backbone_checkpoint else None
        # Decided on the unwrapped shapes: FSDP flattens parameters to 1-D shards.
        self._no_weight_decay = {n for n, p in self.student.named_parameters() if p.ndim <= 1 or n.endswith(".bias")}
        self.schedules: DINOSchedules | None = None
        self._steps_per_epoch = 1
        # Set by a non-finite loss in any micro-batch, cleared after the optimizer step: with gradient
        # accumulation the whole step is skipped (its gradients hold the non-finite micro-batch's).
        self._skip_update = False
        self._skipped_steps = 0
        # step whose teacher entropies were logged last: CollapseMonitor counts each value once
        self.entropies_logged_at: int | None = None

    @property
    def out_dim(self) -> int:
        return self.hparams.out_dim

    def trained_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` of what the optimizer updates: the student's (an extended objective
        may add parameters that live outside both branches, e.g. iBOT's mask token)."""
        return list(self.student.named_parameters())

    def final_tokens(self, branch: str) -> FinalTokens:
        """The patch tokens of the ``"student"``'s or ``"teacher"``'s backbone forwards (made once)."""
        if branch not in self._final_tokens:
            self._final_tokens[branch] = FinalTokens(getattr(self, branch)["backbone"])
        return self._final_tokens[branch]

    def branch_extras(self, embed_dim: int) -> dict[str, nn.Module]:
        """Modules an extended objective adds to both branches (built twice, then the teacher is
        loaded from the student, so both start equal and the EMA pairs them). DINO: none."""
        return {}

    def on_fit_start(self) -> None:
        """Say in one line what a new run took from ``backbone_checkpoint`` and what it initialised
        (a resumed run's weights come from its checkpoint instead)."""
        if self._start_weights is not None and self.trainer.ckpt_path is None and self.trainer.is_global_zero:
            print(f"locatdino fit: {start_line(self, self._start_weights)}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ forward

    @staticmethod
    def forward_branch(branch: nn.ModuleDict, crop_groups: list[Tensor]) -> Tensor:
        """Crops ``[V_i, B, 3, H_i, W_i]`` per resolution → head logits ``[ΣV_i, B, K]``.

        One backbone forward per resolution, one head forward for all views (view-major).
        """
        groups = [g for g in crop_groups if g.shape[0] > 0]
        batch = groups[0].shape[1]
        embeddings = torch.cat([branch["backbone"](g.flatten(0, 1)) for g in groups])
        return branch["head"](embeddings).unflatten(0, (-1, batch))

    def forward(self, x: Tensor) -> Tensor:
        """Teacher embedding ``[B, C]`` of images ``[B, 3, H, W]``."""
        return self.eval_backbone(x)

    # ------------------------------------------------------------------ training

    def schedule_values(self, step: int) -> dict[str, float]:
        """This optimizer step's scheduled values (:class:`DINOSchedules`; the Gram loss weight)."""
        values = self.schedules.at(step)
        if self.gram is not None:
            values["gram_loss_weight"] = self.gram.weight(step)
        return values

    def _patch_tokens(self, branch: str, wanted: bool) -> AbstractContextManager[list[Tensor]]:
        """The patch tokens of the ``branch``'s backbone forwards in the block, when ``wanted``."""
        return self.final_tokens(branch).kept() if wanted else nullcontext([])

    def step_losses(self, batch: dict[str, Tensor], values: dict[str, float]) -> StepLosses:
        """DINO's loss: teacher targets of the global crops, the student on every crop (plus the
        Gram loss of the global crops' patch tokens)."""
        gram = self.gram is not None and self.gram.active
        with torch.no_grad(), self._patch_tokens("teacher", gram and self.gram.teacher is None) as t_patches:
            teacher_out = self.forward_branch(self.teacher, [batch["global"]])
            teacher_probs = self.dino_loss.teacher_targets(teacher_out, values["teacher_temp"])
        with self._patch_tokens("student", gram) as s_patches:  # the global crops' forward comes first
            student_out = self.forward_branch(
                self.student, [batch["global"], *([batch["local"]] if "local" in batch else [])]
            )
        step = StepLosses(self.dino_loss(student_out, teacher_probs), teacher_probs, [(self.dino_loss, teacher_out)])
        if gram:
            step.parts["dino_loss"] = step.loss.detach()
            self.add_gram_loss(step, batch["global"], s_patches[0], t_patches[0] if t_patches else None, values)
        return step

    def add_gram_loss(
        self,
        step: StepLosses,
        crops: Tensor,
        student_patches: Tensor,
        ema_patches: Tensor | None,
        values: dict[str, float],
        masks: Tensor | None = None,
    ) -> None:
        """Add the weighted Gram loss of the global ``crops`` ``[V_g, B, 3, H, W]`` to ``step``
        (student patch tokens ``[V_g·B, N, D]``, the EMA teacher's with ``ema_teacher``, iBOT's
        ``masks`` ``[V_g·B, N]``) and to its logged parts."""
        gram = self.gram(crops.flatten(0, 1), student_patches, ema_patches, masks)
        step.loss = step.loss + values["gram_loss_weight"] * gram
        step.parts.update(gram_loss=gram.detach(), gram_loss_weight=values["gram_loss_weight"])

    def centred_losses(self) -> tuple[DINOLoss, ...]:
        """The losses whose centre moves after every optimizer step (what :meth:`step_losses`
        hands them as ``center_inputs``)."""
        return (self.dino_loss,)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        self._check_batch(batch["global"])
        if self.gram is not None:
            self.gram.before_step(self.trainer.global_step, self.teacher["backbone"])
        values = self.schedule_values(self.trainer.global_step)
        step = self.step_losses(batch, values)
        loss = step.loss

        nonfinite = self.trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss)), all=False)
        if nonfinite:
            self._on_nonfinite(loss)  # "stop" raises; "skip" marks the whole optimizer step skipped
        if not self._skip_update:  # (else a micro-batch of this step was not finite: its gradients are in)
            for criterion, teacher_out in step.center_inputs:
                criterion.accumulate_center(teacher_out)  # applied once per optimizer step
        # a skipped step logs NaN as its loss and its own schedule values and entropies: Lightning
        # would otherwise repeat the previous step's values in its row of metrics.csv
        self.log("train/loss", torch.full_like(loss, float("nan")) if self._skip_update else loss, prog_bar=True)
        every = self.trainer.log_every_n_steps
        if every and (self.trainer.global_step + 1) % every == 0:
            # only on the steps the logger writes (Lightning's rule; 0: never): its per-call
            # bookkeeping is not free
            entropies = {}
            if step.teacher_probs is not None:
                entropy, batch_entropy = teacher_entropies(step.teacher_probs)
                entropies = {ENTROPY_KEY: entropy, MARGINAL_ENTROPY_KEY: batch_entropy}
                self.entropies_logged_at = self.trainer.global_step
            self.log_dict(
                {
                    "train/lr": values["lr"],
                    "train/wd": values["weight_decay"],
                    "train/teacher_momentum": values["teacher_momentum"],
                    "train/teacher_temp": values["teacher_temp"],
                    **entropies,
                    **{f"train/{name}": value for name, value in step.parts.items()},
                }
            )
        if self._skip_update:
            # DDP needs the backward on every rank (Lightning refuses a None loss there); its
            # gradients are dropped in configure_gradient_clipping.
            return torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)
        return loss

    def _check_batch(self, crops_global: Tensor) -> None:
        if crops_global.ndim != 5 or crops_global.shape[0] < 1:
            raise ValueError(f"batch['global'] must be [V_g, B, 3, H, W], got {tuple(crops_global.shape)}")
        self.check_batch_size(crops_global.shape[1])

    def _on_nonfinite(self, loss: Tensor) -> None:
        step = self.trainer.global_step
        if self.hparams.on_nonfinite == "skip":
            if not self._skip_update:  # once per optimizer step, however many micro-batches fail
                rank_zero_warn(
                    f"{self.loss_name} loss is not finite at step {step} (on some rank; here {loss.item()}): "
                    "skipping the step on every rank."
                )
                self._skipped_steps += 1
                self._skip_update = True
            self.log("train/skipped_steps", float(self._skipped_steps))
            return
        raise self.nonfinite_loss_error(loss, self.loss_name, ", or set model.on_nonfinite=skip")

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Called by Lightning after backward and after unscaling 16-mixed gradients."""
        if self._skip_update:
            for p in self._clipped_params:
                p.grad = None
            return
        if self.trainer.global_step < round(self.hparams.freeze_last_layer * self._steps_per_epoch):
            for p in self._last_layer_params:
                p.grad = None
        if self.hparams.clip_grad:
            clip_grad_per_tensor_(
                self._clipped_params, self.hparams.clip_grad, sharded=isinstance(self.trainer.strategy, FSDPStrategy)
            )
        # Trainer(gradient_clip_val=...) still applies on top, as users expect.
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        """Set this step's lr and weight decay, step (the closure runs ``training_step``), then the
        centre update (once per step, over all its micro-batches) and the teacher EMA."""
        values = self.schedule_values(self.trainer.global_step)
        for group in optimizer.param_groups:
            group["lr"] = values["lr"]
            if group["scheduled_weight_decay"]:
                group["weight_decay"] = values["weight_decay"]
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        for criterion in self.centred_losses():
            if self._skip_update:  # also the teacher outputs of micro-batches before the non-finite one
                criterion.discard_center_update()
            else:
                criterion.apply_center_update()
        if not self._skip_update:
            update_teacher(self.student.parameters(), self.teacher.parameters(), values["teacher_momentum"])
        if self.gram is not None:
            self.gram.after_step(self.trainer.global_step, self.teacher["backbone"])
        self._skip_update = False

    # ------------------------------------------------------------------ optimiser and schedules

    def configure_optimizers(self) -> torch.optim.Optimizer:
        length = self.run_length()
        self._steps_per_epoch = length.steps_per_epoch
        h = self.hparams
        self.schedules = DINOSchedules.build(
            total_steps=length.total_steps,
            steps_per_epoch=length.steps_per_epoch,
            global_batch=length.global_batch,
            base_lr=h.lr,
            min_lr=h.min_lr,
            warmup_epochs=h.warmup_epochs,
            weight_decay=h.weight_decay,
            weight_decay_end=h.weight_decay_end,
            momentum_teacher=h.momentum_teacher,
            momentum_teacher_end=h.momentum_teacher_end,
            teacher_temp=h.teacher_temp,
            warmup_teacher_temp=h.warmup_teacher_temp,
            warmup_teacher_temp_epochs=h.warmup_teacher_temp_epochs,
        )
        if self.gram is not None:
            self.gram.build_schedule(length.total_steps, length.steps_per_epoch)

        if any(s.shape != t.shape for s, t in zip(self.student.parameters(), self.teacher.parameters())):
            raise ValueError(
                "student and teacher are sharded differently, the EMA cannot pair them: use "
                "trainer.strategy locatdino.ssl.objective.fsdp.DINOFSDPStrategy (DINOWrapPolicy) for FSDP"
            )
        named = [(unwrapped_name(n), p) for n, p in self.trained_parameters() if p.requires_grad]
        self._clipped_params = [p for _, p in named]
        self._last_layer_params = [p for n, p in named if n.startswith(self.last_layer_prefixes)]
        groups = [
            {"params": [p for n, p in named if n not in self._no_weight_decay], "scheduled_weight_decay": True},
            {
                "params": [p for n, p in named if n in self._no_weight_decay],
                "weight_decay": 0.0,
                "scheduled_weight_decay": False,
            },
        ]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=float(self.schedules.lr[0]))
