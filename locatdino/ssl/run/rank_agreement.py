"""Every rank of a run trains the same config, or none trains.

Each node of a multi-node job parses its own command line and config files: a node launched with
another ``--model.lr`` (a stale copy of a recipe, an edited launch line, another checkout) used
to train to the end next to the others, each rank stepping with its own settings, with exit
status 0 and nothing in any log. :class:`SameConfigOnEveryRank` compares them when the process
group exists, before the first step: one all-gather of a digest of the resolved config (a few
bytes per rank); only when the digests differ, a second one of the configs themselves, to name
the first key that differs and its two values. Every rank then stops with the same one line.
The ``--config`` file names are left out (the same settings may come from copies at other
paths); the values they set are compared.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch.distributed as dist
from jsonargparse import Namespace
from lightning.pytorch import Callback, LightningModule, Trainer

from locatdino.common.errors import UserError

_NOT_COMPARED = ("config", "__default_config__")  # where the settings were read from, not what they are


def flat_config(config: Namespace) -> dict[str, str]:
    """``config``'s leaf keys (``model.init_args.lr``) and their values as JSON text, in its order."""
    return {
        key: json.dumps(config[key], default=str, sort_keys=True) for key in config.keys() if key not in _NOT_COMPARED
    }


def config_digest(flat: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(flat.items())).encode()).hexdigest()


def first_difference(configs: list[dict[str, str]]) -> str | None:
    """``"<key> is <value> on rank 0, <value> on rank <r>"`` for the first key (in rank 0's order,
    then the other rank's) that some rank resolved differently from rank 0, or ``None``."""
    first = configs[0]
    for rank, config in enumerate(configs[1:], start=1):
        for key in [*first, *(k for k in config if k not in first)]:
            if first.get(key) != config.get(key):
                return f"{key} is {first.get(key, 'not set')} on rank 0, {config.get(key, 'not set')} on rank {rank}"
    return None


class SameConfigOnEveryRank(Callback):
    """Stop every rank with one :class:`UserError` when the ranks resolved different configs."""

    def __init__(self, config: Namespace) -> None:
        self.flat = flat_config(config)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.world_size <= 1 or not dist.is_initialized():
            return
        digests: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(digests, config_digest(self.flat))
        if len(set(digests)) == 1:
            return
        configs: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(configs, self.flat)
        raise UserError(
            f"the ranks were launched with different settings: {first_difference(configs)}; launch "
            "every rank with the same command line and config files"
        )
