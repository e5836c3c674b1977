"""What every pretraining objective of ``locatdino fit`` shares (DINO, supervised; docs/pretraining.md).

``locatdino fit`` binds the model group to :class:`PretrainingObjective` in LightningCLI's
subclass mode, so the recipe's ``model.class_path`` chooses the objective
(``locatdino.ssl.DINOModule``, ``locatdino.ssl.SupervisedModule``). Each objective names the
network that is evaluated and exported (:attr:`evaluated_network`, its backbone's state-dict
prefix ``<evaluated_network>.backbone.``; the name is also written into every checkpoint, so
``locatdino export`` and the checkpoint loaders find it without being told), and gets from here
the plumbing both need: the run's length in optimizer steps for per-iteration schedules (checked
again on resume), the one-time batch-size check of the lr scaling rule and the message of a
non-finite loss, and the two options that trade compute for memory or compile time for speed
(``grad_checkpointing``, ``compile``; :meth:`PretrainingObjective.prepare_backbones`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from locatdino.common.errors import UserError
from locatdino.models.checkpoints.contents import EVALUATED_NETWORK_KEY
from locatdino.ssl.objective.fsdp import DINOFSDPStrategy

_RUN_LENGTH_KEY = "run_length"
_RECOMPILE_LIMIT = 32


@dataclass(frozen=True)
class RunLength:
    """A run in optimizer steps, as Lightning will count them: what per-step schedules are built for."""

    total_steps: int
    steps_per_epoch: int
    global_batch: int
    world_size: int = 0  # 0: a checkpoint from before it was recorded


def resumed_run_change(then: RunLength, now: RunLength) -> str:
    """One line on what differs between the run a checkpoint was saved in (``then``) and its
    resumed run (``now``). On another number of ranks: the global batch, the peak lr (every
    objective scales it linearly with the global batch), the steps per epoch and the schedules'
    length, and the data order (the shards are split over the ranks anew)."""
    if then.world_size and then.world_size != now.world_size:
        lr_factor = now.global_batch / then.global_batch
        return (
            f"resumed on {now.world_size} ranks, the checkpoint was trained on {then.world_size}: global batch "
            f"{then.global_batch} -> {now.global_batch} images, so the peak lr x {lr_factor:g} "
            f"(it scales with the global batch); {then.steps_per_epoch} -> {now.steps_per_epoch} steps per epoch, "
            f"schedules rebuilt for {now.total_steps} steps (were {then.total_steps}); the shards are split over "
            "the ranks anew, so the data order differs from an uninterrupted run"
        )
    return (
        f"the schedules differ from the checkpoint's: {asdict(then)} then, {asdict(now)} now "
        "(changed max_epochs/max_steps or batch size?)"
    )


class PretrainingObjective(LightningModule):
    """Base class of the ``fit`` objectives: a backbone trained by some loss, evaluated frozen.

    Subclasses set :attr:`evaluated_network`, define :attr:`eval_backbone`, take ``batch_size``
    (images per rank per step, linked from ``data.init_args.batch_size``) and build their
    schedules from :meth:`run_length` in ``configure_optimizers``.
    """

    evaluated_network: str = ""

    def __init__(self) -> None:
        super().__init__()
        self._run_length: RunLength | None = None  # what the schedules were built for (checked on resume)
        self._checked_batch_size = False
        self._checkpointed: nn.Module | None = None  # the backbone timm checkpoints (grad_checkpointing)

    def prepare_backbones(self, trained: nn.Module, *frozen: nn.Module) -> None:
        """Apply the objective's ``grad_checkpointing`` and ``compile`` options to its backbones.

        ``grad_checkpointing``: the ``trained`` backbone's blocks keep only their inputs and
        recompute their activations in the backward (timm's ``set_grad_checkpointing``; GAug
        attention runs inside the blocks, so it is recomputed too). A ``frozen`` backbone (the
        teacher) runs without gradients and keeps no activations anyway. Under FSDP the strategy
        wraps each block instead (:meth:`setup`). ``compile``: every backbone is compiled in place
        (``nn.Module.compile``), so parameter names, checkpoints and exports keep their keys (no
        ``_orig_mod.``) and a run resumes compiled or eager from either. Static shapes: each crop
        resolution compiles once, the first time it is seen.
        """
        h = self.hparams
        if h.grad_checkpointing:
            if not hasattr(trained, "set_grad_checkpointing"):
                raise UserError(
                    f"model.grad_checkpointing: the backbone {h.backbone} ({type(trained).__name__}) "
                    "has no set_grad_checkpointing"
                )
            trained.set_grad_checkpointing(True)
            self._checkpointed = trained
        if h.compile:
            # every backbone's compiled versions count against one limit (they share timm's forward
            # code): one per backbone, crop size and grad mode, and each once more when GAug's
            # patch-grid record first changes (its contents are guarded)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _RECOMPILE_LIMIT)
            for backbone in (trained, *frozen):
                backbone.compile(dynamic=False)

    def setup(self, stage: str) -> None:
        """Under FSDP, ``grad_checkpointing`` goes through the strategy's activation checkpointing of
        each block (:class:`~locatdino.ssl.objective.fsdp.DINOFSDPStrategy`): timm's own would recompute
        FSDP units outside the hooks that gather their parameters."""
        strategy = getattr(self._trainer, "strategy", None)
        if self._checkpointed is not None and isinstance(strategy, FSDPStrategy):
            if not isinstance(strategy, DINOFSDPStrategy):
                raise UserError(
                    "model.grad_checkpointing under FSDP needs trainer.strategy dino_fsdp "
                    "(locatdino.ssl.objective.fsdp.DINOFSDPStrategy), which checkpoints each block"
                )
            self._checkpointed.set_grad_checkpointing(False)

    @property
    def eval_backbone(self) -> nn.Module:
        """The backbone to evaluate (``HummingbirdMonitor``) and export."""
        return getattr(self, self.evaluated_network).backbone

    def run_length(self) -> RunLength:
        """Total and per-epoch optimizer steps and the global batch of this run; warns when they
        differ from those the resumed checkpoint's schedules were built for."""
        trainer = self.trainer
        total_steps = trainer.estimated_stepping_batches
        if trainer.train_dataloader is None:  # estimated_stepping_batches skips this when max_epochs=-1
            trainer.fit_loop.setup_data()
        batches = trainer.num_training_batches
        name = type(self).__name__
        if not math.isfinite(total_steps) or not math.isfinite(batches):
            raise ValueError(
                f"{name} needs a known number of batches per epoch to build its per-step schedules: "
                "use a data module with a fixed number of batches per rank per epoch (and/or set trainer.max_steps)"
            )
        length = RunLength(
            total_steps=int(total_steps),
            # optimizer steps per epoch as Lightning counts them: a last, partial accumulation steps too
            steps_per_epoch=max(math.ceil(batches / trainer.accumulate_grad_batches), 1),
            global_batch=int(self.hparams.batch_size * trainer.world_size * trainer.accumulate_grad_batches),
            world_size=trainer.world_size,
        )
        then = self._run_length
        if then is not None and then != (length if then.world_size else replace(length, world_size=0)):
            rank_zero_warn(f"{name}: {resumed_run_change(then, length)}")
        self._run_length = length
        return length

    def check_batch_size(self, images: int) -> None:
        """Warn once when the first batch is not the ``batch_size`` the lr was scaled for."""
        if not self._checked_batch_size:
            self._checked_batch_size = True
            if images != self.hparams.batch_size:
                rank_zero_warn(
                    f"{type(self).__name__}: the lr was scaled for batch_size={self.hparams.batch_size} per rank but "
                    f"the first batch has {images} images; set model.batch_size to match."
                )

    def nonfinite_loss_error(self, loss: Tensor, what: str, more: str = "") -> FloatingPointError:
        """The error that stops a run at a non-finite loss, naming the checkpoint to resume (``more``:
        further remedies of this objective)."""
        saved = [cb.last_model_path for cb in self.trainer.checkpoint_callbacks if getattr(cb, "last_model_path", "")]
        return FloatingPointError(
            f"{what} loss is not finite at step {self.trainer.global_step}, epoch {self.current_epoch} "
            f"(on some rank; here {loss.item()}): stopping. "
            f"Last good checkpoint: {saved[-1] if saved else 'none saved yet'}. Resume it with --ckpt_path last "
            f"using bf16-mixed or 32-true instead of 16-mixed, a lower model.lr or model.clip_grad{more}."
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[EVALUATED_NETWORK_KEY] = self.evaluated_network
        checkpoint[_RUN_LENGTH_KEY] = asdict(self._run_length) if self._run_length is not None else None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(_RUN_LENGTH_KEY)
        self._run_length = RunLength(**saved) if saved else None
