"""iBOT as a LightningModule: DINO's class-token self-distillation plus masked-patch prediction
(Zhou et al., ICLR 2022; the patch loss of the DINOv2 recipe, Oquab et al. 2023; docs/pretraining.md)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from locatdino.models.token_grid import token_grid
from locatdino.ssl.dino.loss import DINOLoss
from locatdino.ssl.dino.module import DINOModule, StepLosses
from locatdino.ssl.ibot.koleo_loss import KoLeoLoss
from locatdino.ssl.ibot.mask_token import MaskToken
from locatdino.ssl.ibot.masking import BlockMasking, mask_rng
from locatdino.ssl.ibot.patch_loss import IBOTPatchLoss
from locatdino.ssl.objective.head import DINOHead
from locatdino.ssl.objective.schedules import warmup_constant_schedule

_MASK_SEED_KEY = "ibot_mask_seed"


class IBOTModule(DINOModule):
    """iBOT pretraining of any timm ViT (LocAtViT or vanilla): DINO plus masked-patch prediction.

    DINO's loss on the class embeddings plus, on the masked patches of the student's global crops, a
    cross-entropy to the teacher's patch targets of the same, unmasked crops; optionally DINOv2's
    KoLeo on the student's class embeddings. Everything else is :class:`DINOModule`'s: schedules,
    EMA teacher (the evaluated and exported network), per-tensor clipping, last-layer freeze (both
    heads), non-finite handling, gradient accumulation, DDP / FSDP, checkpoints.

    Per step: the global crops ``[V_g, B, 3, H, W]`` get block-wise masks (:class:`BlockMasking`,
    drawn from ``(mask_seed, rank, step, micro-batch)``: a resume replays them); the student sees
    them with the masked patch embeddings replaced by a learned token (:class:`MaskToken`;
    before the position embedding) and the local crops unmasked; the teacher sees the global
    crops unmasked. The DINO loss uses the student's class embeddings of the masked global crops
    and of the local crops, as both references do. Patch heads run on the masked positions only
    (DINOv2's economy); the patch centre is therefore the running mean of the teacher's patch
    logits at masked positions (DINOv2; iBOT averages over every patch).

    Extra checkpoint keys: ``mask_token.token`` (trained with the student, no EMA copy: the
    teacher never sees masks), ``{student,teacher}.patch_head.*`` with a separate head,
    ``ibot_loss.center``.

    Gram anchoring (``gram``, :class:`DINOModule`'s) reads the student's patch tokens of the masked
    global crops, as DINOv3 does, and ``gram.tokens_used`` may keep only the masked or unmasked ones.

    Args:
        mask_probability: share of the global crops that are masked (0.5).
        mask_ratio: ``(low, high)`` masked share of a masked crop, spread evenly over the masked
            crops (0.1–0.5).
        mask_min_patches: smallest masked block, in patches (4).
        mask_aspect_ratio: block aspect ratios in ``[r, 1 / r]`` (0.3).
        mask_seed: seed of the masks (``None``: ``torch.initial_seed()`` when built, i.e. the
            run's ``seed_everything``); kept in the checkpoint.
        separate_patch_head: a patch head of its own (DINOv2's recipe; iBOT's default shares
            the MLP but not the last layer, its ViT-S/16 script shares both), else DINO's head
            on the patches too.
        patch_out_dim: prototypes of a separate patch head (``None``: ``out_dim``).
        teacher_patch_temp: teacher temperature of the patch targets after the warm-up (0.07).
        warmup_teacher_patch_temp: at step 0, warmed up linearly over
            ``warmup_teacher_temp_epochs`` (0.04).
        patch_center_momentum: EMA momentum of the patch centre (0.9).
        patch_centering: ``"center"`` or ``"sinkhorn_knopp"`` (DINOv2's option; no centre).
        sinkhorn_iterations: Sinkhorn–Knopp iterations (3).
        dino_loss_weight: ``λ1`` of the class-token loss (1).
        ibot_loss_weight: ``λ2`` of the masked-patch loss (1).
        koleo_loss_weight: KoLeo weight (0: off; DINOv2 0.1), summed over the global crops.
        **kwargs: :class:`DINOModule`'s arguments.
    """

    loss_name = "iBOT"
    masks_patches = True
    last_layer_prefixes = ("head.last_layer.", "patch_head.last_layer.")

    def __init__(
        self,
        mask_probability: float = 0.5,
        mask_ratio: tuple[float, float] = (0.1, 0.5),
        mask_min_patches: int = 4,
        mask_aspect_ratio: float = 0.3,
        mask_seed: int | None = None,
        separate_patch_head: bool = True,
        patch_out_dim: int | None = None,
        teacher_patch_temp: float = 0.07,
        warmup_teacher_patch_temp: float = 0.04,
        patch_center_momentum: float = 0.9,
        patch_centering: Literal["center", "sinkhorn_knopp"] = "center",
        sinkhorn_iterations: int = 3,
        dino_loss_weight: float = 1.0,
        ibot_loss_weight: float = 1.0,
        koleo_loss_weight: float = 0.0,
        **kwargs: Any,
    ) -> None:
        masking = BlockMasking(mask_probability, tuple(mask_ratio), mask_min_patches, mask_aspect_ratio)
        super().__init__(**kwargs)  # (calls branch_extras: the patch head)
        h = self.hparams
        if not separate_patch_head and patch_out_dim not in (None, h.out_dim):
            raise ValueError(
                f"IBOTModule: patch_out_dim {patch_out_dim} needs separate_patch_head (a shared "
                f"head has out_dim {h.out_dim} prototypes)"
            )
        self.masking = masking
        self.ibot_loss = IBOTPatchLoss(
            self.patch_out_dim, h.student_temp, patch_center_momentum, patch_centering, sinkhorn_iterations
        )
        self.koleo_loss = KoLeoLoss()
        # one token, outside both branches: the teacher never sees masks (and under FSDP it stays in
        # the root unit, unsharded for the whole step, where the patch-embedding hook reads it)
        self.mask_token = MaskToken(self.student["backbone"].embed_dim)
        self.mask_token.attach(self.student["backbone"])
        for branch in ("student", "teacher"):
            self.final_tokens(branch)
        self.mask_seed = torch.initial_seed() if mask_seed is None else mask_seed
        self._micro_batch = 0  # micro-batches since the last optimizer step (gradient accumulation)
        self._patch_temp: np.ndarray | None = None

    def branch_extras(self, embed_dim: int) -> dict[str, nn.Module]:
        h = self.hparams
        if not h.separate_patch_head:
            return {}
        return {
            "patch_head": DINOHead(
                embed_dim,
                self.patch_out_dim,
                h.hidden_dim,
                h.bottleneck_dim,
                h.head_layers,
                h.use_bn_in_head,
                h.norm_last_layer,
            )
        }

    @property
    def patch_out_dim(self) -> int:
        """The patch head's prototypes: ``patch_out_dim``, ``out_dim`` when it is ``None``."""
        h = self.hparams
        return h.out_dim if h.patch_out_dim is None else h.patch_out_dim

    def trained_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [*super().trained_parameters(), *self.mask_token.named_parameters(prefix="mask_token")]

    def _patch_head(self, branch: nn.ModuleDict) -> nn.Module:
        return branch["patch_head"] if self.hparams.separate_patch_head else branch["head"]

    # ------------------------------------------------------------------ masks

    def draw_masks(self, num_crops: int, grid: tuple[int, int], step: int, micro_batch: int = 0) -> Tensor:
        """``[num_crops, h·w]`` bool (CPU) of one micro-batch, from ``(mask_seed, rank, step, micro_batch)``."""
        rng = mask_rng(self.mask_seed, self.global_rank, step, micro_batch)
        return torch.from_numpy(self.masking(num_crops, grid, rng))

    # ------------------------------------------------------------------ training

    def schedule_values(self, step: int) -> dict[str, float]:
        """DINO's values and ``teacher_patch_temp``."""
        values = super().schedule_values(step)
        values["teacher_patch_temp"] = float(self._patch_temp[min(max(step, 0), len(self._patch_temp) - 1)])
        return values

    def step_losses(self, batch: dict[str, Tensor], values: dict[str, float]) -> StepLosses:
        h = self.hparams
        crops = batch["global"]
        v_g, b = crops.shape[:2]
        images = crops.flatten(0, 1)
        grid = token_grid(self.student["backbone"], tuple(images.shape[-2:]))
        masks = self.draw_masks(v_g * b, grid, self.global_step, self._micro_batch).to(images.device)
        self._micro_batch += 1

        with torch.no_grad():
            t_embedding, t_patches = self.final_tokens("teacher")(self.teacher["backbone"], images)
            teacher_out = self.teacher["head"](t_embedding).unflatten(0, (v_g, b))
            teacher_probs = self.dino_loss.teacher_targets(teacher_out, values["teacher_temp"])
            teacher_patch_out = self._patch_head(self.teacher)(t_patches[masks])
            teacher_patch_probs = self.ibot_loss.teacher_targets(teacher_patch_out, values["teacher_patch_temp"])

        with self.mask_token.masking(masks):
            s_embedding, s_patches = self.final_tokens("student")(self.student["backbone"], images)
        embeddings = [s_embedding]
        if "local" in batch and batch["local"].shape[0] > 0:
            embeddings.append(self.student["backbone"](batch["local"].flatten(0, 1)))
        student_out = self.student["head"](torch.cat(embeddings)).unflatten(0, (-1, b))

        dino = self.dino_loss(student_out, teacher_probs)
        ibot = self.ibot_loss(self._patch_head(self.student)(s_patches[masks]), teacher_patch_probs, masks)
        loss = h.dino_loss_weight * dino + h.ibot_loss_weight * ibot
        parts: dict[str, Tensor | float] = {
            "dino_loss": dino.detach(),
            "ibot_loss": ibot.detach(),
            "teacher_patch_temp": values["teacher_patch_temp"],
        }
        if h.koleo_loss_weight:
            koleo = sum(self.koleo_loss(e) for e in s_embedding.unflatten(0, (v_g, b)))
            loss = loss + h.koleo_loss_weight * koleo
            parts["koleo_loss"] = koleo.detach()
        centered = [(self.dino_loss, teacher_out)]
        if self.ibot_loss.uses_center:
            centered.append((self.ibot_loss, teacher_patch_out))
        step = StepLosses(loss, teacher_probs, centered, parts)
        if self.gram is not None and self.gram.active:  # the student's masked crops, as in DINOv3
            self.add_gram_loss(step, crops, s_patches, t_patches, values, masks)
        return step

    def centred_losses(self) -> tuple[DINOLoss, ...]:
        return (self.dino_loss, self.ibot_loss) if self.ibot_loss.uses_center else (self.dino_loss,)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._micro_batch = 0

    # ------------------------------------------------------------------ schedules and checkpoints

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = super().configure_optimizers()
        length, h = self._run_length, self.hparams
        self._patch_temp = warmup_constant_schedule(
            h.warmup_teacher_patch_temp,
            h.teacher_patch_temp,
            length.total_steps,
            int(round(h.warmup_teacher_temp_epochs * length.steps_per_epoch)),
        )
        return optimizer

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[_MASK_SEED_KEY] = self.mask_seed

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.mask_seed = checkpoint.get(_MASK_SEED_KEY, self.mask_seed)
