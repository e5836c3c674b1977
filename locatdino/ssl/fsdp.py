"""FSDP for DINO: the wrapping policy and a strategy preset (configs/fsdp_vitl16.yaml).

Every transformer block, every backbone and every head becomes its own FSDP unit. Student and
teacher are therefore sharded identically (same units, same shapes, same order), which is what
lets :func:`~locatdino.ssl.teacher_update.update_teacher` run on the local shards with no
communication, and the frozen teacher never shares a flat parameter with the trained student.

:class:`DINOFSDPStrategy` exists because ``FSDPStrategy``'s ``auto_wrap_policy`` argument is
annotated with a string forward reference that LightningCLI cannot resolve: given in YAML it is
silently dropped. The preset also keeps gradient reduction and buffers (the DINO centre) in
fp32 under ``bf16-mixed`` / ``16-mixed``, as the reference's AMP does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import FSDPStrategy
from timm.models.vision_transformer import Block, VisionTransformer
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from locatdino.ssl.head import DINOHead


class DINOWrapPolicy(ModuleWrapPolicy):
    """``ModuleWrapPolicy({Block, VisionTransformer, DINOHead})`` (timm ViT and LocAtViT)."""

    def __init__(self) -> None:
        super().__init__({Block, VisionTransformer, DINOHead})


class DINOFSDPStrategy(FSDPStrategy):
    """``FSDPStrategy`` with :class:`DINOWrapPolicy`, optional activation checkpointing per block.

    Args:
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``HYBRID_SHARD``
            (shard within a node, replicate across nodes), ``NO_SHARD``.
        state_dict_type: ``full`` writes one checkpoint file (what ``locatdino export`` reads);
            ``sharded`` a folder with one shard per rank (faster for very large models).
        activation_checkpointing: recompute each transformer block in backward (less memory).
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
            activation_checkpointing_policy=ModuleWrapPolicy({Block}) if activation_checkpointing else None,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            **kwargs,
        )

    @property
    def mixed_precision_config(self):
        config = super().mixed_precision_config
        if config is None:
            return None
        return dataclasses.replace(config, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
