"""What ``locatdino fit`` checks before anything is built, and how its parser reports errors.

LightningCLI parses and type-checks the config, but the values users most often get wrong are
well-typed: a batch size of 0 (``ZeroDivisionError`` deep in the data module), a crop size the
patch does not divide, a shard folder that does not exist, a misspelt model name, a checkpoint
path with a typo, a ``--ckpt_path`` that is not a training checkpoint, names no file to resume
or was trained with another objective or model (Lightning would silently take the checkpoint's),
a fresh run into a folder holding another run's checkpoints (Lightning would replace them), a run
folder that cannot be written, a learning rate that would not train, an objective option out of its
range (:mod:`locatdino.ssl.run.option_checks`).
:func:`check_fit_config` checks them on the merged config, before the model, the data or the
Trainer are built, and raises a :class:`~locatdino.common.errors.UserError` naming the config key and
the value. :class:`FitArgumentParser` shortens the parser's own errors (a
100-line usage dump) to one line, naming the ``--config`` file that set the key at fault.
"""

from __future__ import annotations

import math
import os
import re
import sys
from contextvars import ContextVar
from typing import Any, NoReturn

import torch
from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser
from timm.models import split_model_name_tag

from locatdino.common.errors import UserError, first_line
from locatdino.common.output_files import ensure_writable
from locatdino.data.shards.stream import expand_urls
from locatdino.models import create_backbone, load_checkpoint
from locatdino.models.token_grid import fitting_sizes, pads_images, patch_size
from locatdino.ssl.run.config_files import where_set
from locatdino.ssl.run.option_checks import check_objective_options, objective_class

# objective options that change how a step is computed, never what is trained: a run resumes with
# either value (the config's, not the checkpoint's: :meth:`~locatdino.ssl.run.cli.FitCLI.before_instantiate_classes`)
RUNTIME_OPTIONS = ("compile", "grad_checkpointing")
# ckpt_path values Lightning resolves itself
_LIGHTNING_CKPT_NAMES = ("last", "best", "hpc", "registry")


def checkpoint_dir(default_root_dir: str | None) -> str:
    """``<default_root_dir>/checkpoints``: one folder per run, found again on resume."""
    return os.path.join(default_root_dir or ".", "checkpoints")


def earlier_checkpoints(default_root_dir: str | None) -> list[str]:
    """The ``*.ckpt`` files already in the run folder's ``checkpoints/`` (sorted names)."""
    folder = checkpoint_dir(default_root_dir)
    return sorted(n for n in (os.listdir(folder) if os.path.isdir(folder) else ()) if n.endswith(".ckpt"))


# the arguments of the parse in progress (FitCLI.parse_arguments), for FitArgumentParser's errors
FIT_ARGS: ContextVar[tuple[str, ...]] = ContextVar("fit_args", default=())


class FitArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with one-line errors: ``locatdino fit: <key>: <problem> (...)``, or
    ``locatdino fit: --config <file>: <key>: <problem>`` when a ``--config`` file of :data:`FIT_ARGS` set the key."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse's inner parsers: the caller handles it
            super().error(message, ex)
        short = short_parser_message(message)
        key, _, problem = short.partition(": ")
        found = where_set(key, FIT_ARGS.get()) if re.fullmatch(r"[\w.]+", key) else None
        if found is not None:
            short = f"--config {found[0]}: {found[1]}: {problem}"
        print(f"locatdino fit: {short} (locatdino fit --help lists the options)", file=sys.stderr)
        sys.exit(2)


def short_parser_message(message: str) -> str:
    """jsonargparse's nested report (``Parser key "data": Does not validate against any of the
    Union subtypes … Parser key "batch_size": Expected a <class 'int'>. Got value: abc``) as
    ``data.batch_size: Expected a <class 'int'>. Got value: abc``; an option the objective does
    not have, or a key the config does not have, as ``<key>: not an option of <class>`` /
    ``<key>: no such option``."""
    unknown = re.search(r"does not accept option '([^']+)'", message)
    if unknown:
        return f"{unknown.group(1)}: no such option"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    keys = [m.group(1) for line in lines if (m := re.fullmatch(r'(?:- )?Parser key "([^"]+)":?', line))]
    if not keys:
        return lines[0] if lines else "invalid arguments"
    option = re.search(r"Problem with given class_path '([^']+)':\s*Option '([^']+)' is not accepted", message)
    if option:
        return f"{keys[0]}.init_args.{option.group(2)}: not an option of {option.group(1)}"
    last_key = max(i for i, line in enumerate(lines) if re.fullmatch(r'(?:- )?Parser key "[^"]+":?', line))
    detail = lines[last_key + 1] if last_key + 1 < len(lines) else "invalid value"
    if len(keys) > 1 and "class_path" in message:  # a subclass-mode group: its arguments are init_args
        keys.insert(1, "init_args")
    return f"{'.'.join(keys)}: {detail.removeprefix('- ')}"


def _not_a_multiple(key: str, size: int, patch: int, backbone: str) -> UserError:
    return UserError(
        f"data.init_args.{key}: {size} px is not a multiple of the patch size {patch} of {backbone} "
        f"(use {fitting_sizes(size, patch)})"
    )


def _shards_advice(urls: Any) -> str:
    """How to get shards where ``urls`` points: write them there, unless it is a folder holding
    files already (a folder of images, say), whose shards belong in a folder of their own."""
    try:
        with os.scandir(os.path.expanduser(urls)) as entries:  # not a folder, or unreadable: OSError
            holds_files = any(entries)
    except (OSError, TypeError):  # TypeError: a list of URLs
        holds_files = False
    if holds_files:
        target = f"{urls.rstrip('/')}-shards"
        return f"a folder of images? write its shards into a folder of their own: `locatdino shards {urls} {target}`"
    return f"write shards there with `locatdino shards SOURCE {urls if isinstance(urls, str) else 'OUT_DIR'}`"


def check_fit_config(config: Namespace) -> None:
    """Raise a one-line :class:`UserError` for the first value of ``config`` (the merged ``fit``
    config) that would fail later: batch size, model name, crop sizes vs patch size, shard
    paths, checkpoint paths."""
    model, data = config.model.get("init_args") or Namespace(), config.data
    init = data.get("init_args") or Namespace()
    for key in ("batch_size", "batches_per_epoch"):
        value = init.get(key)
        if value is not None and value < 1:
            raise UserError(f"data.init_args.{key}: must be at least 1, got {value}")

    backbone = _check_backbone(model)
    patch = patch_size(backbone)
    multicrop = init.get("multicrop")
    if multicrop is not None and not pads_images(backbone):
        crops = [
            ("global_crop_size", multicrop.get("num_global_crops", 2)),
            ("local_crop_size", multicrop.get("num_local_crops", 0)),
        ]
        for key, count in crops:
            size = multicrop.get(key)
            if count and size is not None and size % patch[0]:
                raise _not_a_multiple(f"multicrop.{key}", size, patch[0], model.backbone)

    size = (init.get("transform") or Namespace()).get("input_size")  # LabelledShardDataModule
    if size is not None and size % patch[0] and not pads_images(backbone):
        raise _not_a_multiple("transform.input_size", size, patch[0], model.backbone)

    for key, synthetic in (("train_urls", "synthetic"), ("val_urls", "synthetic_val")):
        urls = init.get(key)
        if urls is not None and not init.get(synthetic):
            try:
                expand_urls(urls)
            except FileNotFoundError as err:
                raise UserError(f"data.init_args.{key}: {err} ({_shards_advice(urls)})") from None

    lr = model.get("lr")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise UserError(
            f"model.lr: must be a positive number, got {lr} (a negative lr trains by gradient ascent, 0 trains nothing)"
        )
    check_objective_options(config.model, init, backbone)

    ckpt_path = config.get("ckpt_path")
    root = config.trainer.get("default_root_dir")
    if ckpt_path is None and "://" not in str(root) and not config.get("overwrite"):
        earlier = earlier_checkpoints(root)
        if earlier:
            shown = ", ".join(earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
            raise UserError(
                f"trainer.default_root_dir {root!r} already holds another run's checkpoints ({shown}): "
                "resume that run with --ckpt_path last, give this one another --trainer.default_root_dir, "
                "or pass --overwrite to replace it"
            )
    if ckpt_path == "last" and "://" not in str(root):  # a remote run folder is Lightning's to search
        ckpt_path = _last_checkpoint(root)
    if ckpt_path is not None and ckpt_path not in _LIGHTNING_CKPT_NAMES:
        if not os.path.exists(ckpt_path):
            raise UserError(
                f"ckpt_path: no such file {ckpt_path!r} (or 'last' to resume the run in trainer.default_root_dir)"
            )
        check_resume_checkpoint(ckpt_path, model, config.model.get("class_path"))
    if "://" not in str(root):
        _check_writable_root(root)


def _check_writable_root(root: str | None) -> None:
    """:class:`UserError` naming ``trainer.default_root_dir`` when the run folder cannot be written
    (a read-only filesystem, no permission, a file on its path): probed in the folder, or in the
    nearest existing folder above it, without creating anything."""
    existing = os.path.abspath(root or ".")
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        ensure_writable(existing, "folder")
    except OSError as err:
        raise UserError(f"trainer.default_root_dir {root!r}: {err}") from None


def _last_checkpoint(root: str | None) -> str:
    """The file ``--ckpt_path last`` resumes, as Lightning picks it (the newest ``last*.ckpt`` in
    ``<default_root_dir>/checkpoints``); :class:`UserError` when there is none, where Lightning
    would warn and train from scratch."""
    folder = checkpoint_dir(root)
    found = [
        os.path.join(folder, n)
        for n in (os.listdir(folder) if os.path.isdir(folder) else ())
        if re.fullmatch(r"last(-\d+)?\.ckpt", n)
    ]
    if not found:
        raise UserError(
            f"ckpt_path last: no last.ckpt in {folder} to resume (trainer.default_root_dir "
            f"{root!r}): leave --ckpt_path out to start a new run"
        )
    return max(found, key=os.path.getmtime)


def check_resume_checkpoint(path: str, model: Namespace, objective: str | None = None) -> None:
    """:class:`UserError` unless ``path`` is a ``fit`` checkpoint of the ``objective`` class (the
    config's ``model.class_path``) whose model hyper-parameters are the config's: Lightning replaces
    the config's objective and model arguments with the checkpoint's, so a different objective (DINO
    resumed as iBOT), backbone (or lr, head, ...) would silently be trained instead of the one asked
    for. :data:`RUNTIME_OPTIONS` may differ: they do not change what is trained."""
    # mmap: only hyper_parameters is read, the weights and optimizer state stay on disk
    checkpoint = load_checkpoint(path, mmap=True)  # a file torch cannot read: ValueError, one line
    if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
        raise UserError(
            f"ckpt_path {path}: not a locatdino fit checkpoint (no Lightning training state; a plain "
            "state dict or an export?): start from its weights with --model.backbone_checkpoint"
        )
    saved = checkpoint.get("hyper_parameters") or {}
    _check_same_objective(path, saved.get("_class_path"), objective)
    differ = [
        f"model.{k}: {saved[k]!r} in the checkpoint, {model.get(k)!r} in the config"
        for k in saved
        if not k.startswith("_")
        and k not in RUNTIME_OPTIONS
        and k in model
        and _as_saved(saved[k]) != _as_saved(model.get(k))
    ]
    if differ:
        raise UserError(
            f"ckpt_path {path} was trained with other settings ({'; '.join(differ)}): resume with "
            "the run's config, or start a new run from its weights with --model.backbone_checkpoint"
        )


def _check_same_objective(path: str, saved: str | None, configured: str | None) -> None:
    """:class:`UserError` naming both objectives when the checkpoint's class is not the config's
    (compared as classes: ``locatdino.ssl.IBOTModule`` is ``locatdino.ssl.ibot.module.IBOTModule``)."""
    if saved is None or configured is None:  # a checkpoint written outside LightningCLI: nothing to compare
        return
    if (objective_class(saved) or saved) != (objective_class(configured) or configured):
        raise UserError(
            f"ckpt_path {path} holds a {saved} run, the config trains {configured} (model.class_path): "
            "resume with the run's config, or start a new run from its weights with "
            "--model.backbone_checkpoint"
        )


def _as_saved(value: Any) -> Any:
    """``value`` as LightningCLI writes hyper-parameters into a checkpoint (YAML-like: a tuple
    argument such as IBOTModule's ``mask_ratio`` comes back as a list)."""
    return [_as_saved(v) for v in value] if isinstance(value, (tuple, list)) else value


def _check_backbone(model: Namespace) -> Any:
    """The backbone ``model.backbone`` + ``backbone_kwargs`` describes, built on the meta device
    (no memory, no weights): an unknown name, a pretrained tag without weights or a wrong kwarg
    fails here, naming the key."""
    checkpoint = model.get("backbone_checkpoint")
    if checkpoint is not None and not os.path.exists(checkpoint):  # a file, or a Hugging Face folder
        raise UserError(f"model.backbone_checkpoint: no such file or folder {checkpoint!r}")
    name = model.backbone if checkpoint is None else split_model_name_tag(model.backbone)[0]
    kwargs = dict(model.get("backbone_kwargs") or {})
    try:
        with torch.device("meta"):
            return create_backbone(name, **kwargs)
    except ValueError as err:  # the name: unknown, or a pretrained tag without weights
        message = str(err).replace("as the checkpoint", "as model.backbone_checkpoint")
        raise UserError(f"model.backbone: {message}") from None
    except (TypeError, RuntimeError, AssertionError) as err:  # what timm makes of the kwargs
        raise UserError(f"model.backbone_kwargs {kwargs} for {name}: {first_line(err)}") from None
