"""FSDP for DINO: the wrapping policy and a strategy preset (configs/dino_large_fsdp.yaml).

Every transformer block, every backbone, every head and the head's weight-normalised last layer
becomes its own FSDP unit. Student and teacher are therefore sharded identically (same units,
same shapes, same order), which is what lets :func:`~locatdino.ssl.objective.teacher_update.update_teacher`
run on the local shards with no communication, and the frozen teacher never shares a flat
parameter with the trained student. The last layer is a unit of its own because it has no
optimizer state while it is frozen (first epoch): FSDP cannot save the optimizer state of a
unit where only some trainable parameters have one.

:class:`DINOFSDPStrategy` exists because ``FSDPStrategy``'s ``auto_wrap_policy`` argument is
annotated with a string forward reference that LightningCLI cannot resolve: given in YAML it is
silently dropped. The preset also keeps gradient reduction and buffers (the DINO centre) in
fp32 under ``bf16-mixed`` / ``16-mixed``, as the reference's AMP does. Importing this module
registers it as ``trainer.strategy: dino_fsdp`` (``locatdino fit`` does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy
from torch.nn.utils import parametrize

from locatdino.ssl.objective.head import DINOHead

# every timm transformer block (ViT and LocAtViT: GAug attention lives inside the block)
BLOCK_CHECKPOINTING = ModuleWrapPolicy({Block})


def _is_fsdp_unit(module: nn.Module) -> bool:
    return isinstance(module, (Block, VisionTransformer, DINOHead)) or parametrize.is_parametrized(module)


class DINOWrapPolicy(CustomPolicy):
    """Units: timm ``Block``, ``VisionTransformer`` (ViT and LocAtViT), ``DINOHead`` and its
    weight-normalised (parametrized) last layer."""

    def __init__(self) -> None:
        super().__init__(_is_fsdp_unit)


class DINOFSDPStrategy(FSDPStrategy):
    """``FSDPStrategy`` with :class:`DINOWrapPolicy`, optional activation checkpointing per block
    (``activation_checkpointing`` here, or the objective's ``model.grad_checkpointing``).

    Args:
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``HYBRID_SHARD``
            (shard within a node, replicate across nodes), ``NO_SHARD``.
        state_dict_type: ``full`` writes one checkpoint file (what ``locatdino export`` reads);
            ``sharded`` a folder with one shard per rank (faster for very large models).
        activation_checkpointing: recompute each transformer block in backward (less memory); also on
            when the objective's ``grad_checkpointing`` is.
        cpu_offload: keep parameters and gradients on the CPU between uses.
    """

    def __init__(
        self,
        sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            auto_wrap_policy=DINOWrapPolicy(),
            activation_checkpointing_policy=BLOCK_CHECKPOINTING if activation_checkpointing else None,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            **kwargs,
        )

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """On CPU (gloo) wrap with ``device_id=cpu`` first: Lightning passes the device index,
        ``None`` on CPU, and FSDP then refuses to run without an accelerator. An objective with
        ``grad_checkpointing`` gets each block checkpointed (Lightning applies the policy after
        wrapping; the objective has turned timm's own checkpointing off in its ``setup``)."""
        self.follow_grad_checkpointing(model)
        if self.root_device.type == "cpu" and not isinstance(model, FullyShardedDataParallel):
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )
            self.kwargs.pop("auto_wrap_policy", None)  # applied; Lightning would warn that it is ignored
        return super()._setup_model(model)

    def follow_grad_checkpointing(self, model: nn.Module) -> None:
        """Checkpoint every block when the objective asks for ``grad_checkpointing`` (and no
        activation checkpointing policy is set already)."""
        if getattr(model, "hparams", {}).get("grad_checkpointing") and not self._activation_checkpointing_kwargs:
            self._activation_checkpointing_kwargs = {"auto_wrap_policy": BLOCK_CHECKPOINTING}

    @property
    def mixed_precision_config(self):
        config = super().mixed_precision_config
        if config is None:
            return None
        return dataclasses.replace(config, reduce_dtype=torch.float32, buffer_dtype=torch.float32)


StrategyRegistry.register("dino_fsdp", DINOFSDPStrategy, description="FSDP with DINO's wrapping policy", override=True)
