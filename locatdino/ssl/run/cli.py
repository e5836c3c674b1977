"""``locatdino fit``: pretraining from layered YAML configs through Lightning's ``LightningCLI``.

The objective is the model's ``class_path`` (LightningCLI's subclass mode over
:class:`~locatdino.ssl.PretrainingObjective`): ``locatdino.ssl.DINOModule`` (the default) or
``locatdino.ssl.SupervisedModule`` (``configs/sup_*.yaml``, with ``locatdino.data.
LabelledShardDataModule``). A recipe that keeps the default objective may give its init_args
directly (``model: {backbone: ...}``, ``--model.lr``). ``default.yaml`` names no objective: when
neither a recipe nor a flag does, ``fit`` chooses DINO (jsonargparse would otherwise carry the
default objective's values over to another one wherever their argument names agree).

``default.yaml`` of the package's recipes (``locatdino.configs``; ``configs/`` in a checkout) is
always loaded first and holds every key; a recipe file holds only what changes, and
command-line flags override both. ``--config`` takes a file or a shipped recipe's name::

    locatdino fit --config configs/dino_tiny_cpu.yaml --model.backbone locatvit_tiny_patch8_224 --trainer.max_steps 200
    locatdino fit --config dino_small_ddp --ckpt_path last   # resume; works from a wheel install too

Besides LightningCLI's ``model`` / ``data`` / ``trainer`` groups, the callbacks every run needs
are config groups of their own, so a recipe changes one key without restating a callback list:
``step_checkpoint`` (``last.ckpt`` every N steps), ``epoch_checkpoint`` (at epoch end),
``collapse_monitor`` and ``skipped_samples``. Everything a run writes goes under
``trainer.default_root_dir``: ``checkpoints/`` (fixed, so ``--ckpt_path last`` finds it) and
``logs/version_N/`` (CSV metrics and the merged ``config.yaml``; a new version per start; a tracker
given as ``trainer.logger`` logs beside it, ``locatdino.ssl.logs.trackers``), and at the end
``curves.png`` (the curves of all versions, stitched; see ``locatdino.ssl.logs.curves``). The
folder is locked for the run; SIGTERM saves ``last.ckpt`` and exits with status 143, SIGUSR1
outside SLURM likewise with 138 (``locatdino.ssl.run.stop_checkpoint``).
``data.init_args.batch_size`` (per rank) feeds ``model.init_args.batch_size`` for the lr scaling rule.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import warnings
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry
from lightning.pytorch.utilities.exceptions import SIGTERMException

from locatdino.common.errors import UsageError, UserError
from locatdino.common.output_files import disk_full_message, output_lock, remove_stale_temporaries
from locatdino.common.processes import Terminated, stop_status
from locatdino.configs import DEFAULT_CONFIG, resolve_recipe
from locatdino.data import ShardDataModule, SkippedSamplesLogger
from locatdino.ssl import CollapseMonitor, PretrainingObjective  # the package registers trainer.strategy "dino_fsdp"
from locatdino.ssl.logs.curves import CURVES_NAME, write_curves
from locatdino.ssl.logs.progress import LineProgressBar, wants_line_progress
from locatdino.ssl.logs.trackers import log_image, missing_tracker, with_csv_logger
from locatdino.ssl.run.collective_timeout import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    MAX_COLLECTIVE_TIMEOUT_S,
    MIN_COLLECTIVE_TIMEOUT_S,
    LostRank,
    check_collective_timeout,
    lost_rank_message,
    nccl_environment,
    strategy_with_timeout,
    takes_timeout,
)
from locatdino.ssl.run.config_files import config_paths, read_config
from locatdino.ssl.run.fit_checks import (
    FIT_ARGS,
    RUNTIME_OPTIONS,
    FitArgumentParser,
    check_fit_config,
    checkpoint_dir,
    earlier_checkpoints,
)
from locatdino.ssl.run.launch_checks import missing_launcher
from locatdino.ssl.run.rank_agreement import SameConfigOnEveryRank
from locatdino.ssl.run.restarts import record_elastic_job, resume_after_restart
from locatdino.ssl.run.stop_checkpoint import SigtermCheckpoint, StoppedBySignal

DEFAULT_OBJECTIVE = "locatdino.ssl.DINOModule"
# the two ModelCheckpoint config groups of every run, with the title fit --help shows
CHECKPOINT_GROUPS = {
    "step_checkpoint": "last.ckpt every N training steps, the resume point (ModelCheckpoint)",
    "epoch_checkpoint": "a checkpoint at every epoch end, and last.ckpt (ModelCheckpoint)",
}


class MissingDefaultConfigError(FileNotFoundError):
    """``default.yaml`` is not there (a broken install): without it no recipe has all its keys."""


class FitCLI(LightningCLI):
    """``LightningCLI`` for a :class:`PretrainingObjective` with the run's callbacks as config groups.

    ``before_fit``, the training and ``after_fit`` run with the run folder locked by rank 0 (a
    second ``fit`` into it is refused, not raced: :attr:`run_folder` holds the lock from
    ``before_fit`` to the end); a stop signal (while training or before it) ends it as
    :class:`StoppedBySignal`, a collective failed by another rank as :class:`LostRank`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.run_folder = contextlib.ExitStack()
        self.fitting = False  # set by before_fit: only then is a stop or a lost rank the run's to report
        with self.run_folder:
            try:
                super().__init__(*args, **kwargs)
            except (SIGTERMException, Terminated, Exception) as err:
                reported = self.stop_report(err) if self.fitting else None
                if reported is None:
                    raise
                raise reported from None

    def stop_report(self, err: BaseException) -> StoppedBySignal | LostRank | None:
        """What ends a run stopped by ``err``: :class:`StoppedBySignal` naming the signal, the step
        and the checkpoint saved, :class:`LostRank` for a collective another rank failed, or
        ``None`` for anything else."""
        trainer = self.trainer
        if isinstance(err, (SIGTERMException, Terminated)):
            stoppers = [cb for cb in trainer.callbacks if isinstance(cb, SigtermCheckpoint)]
            signum = (
                err.signum
                if isinstance(err, Terminated)
                else next(  # Lightning's own stop: SIGTERM
                    (cb.stopped_by for cb in stoppers if cb.stopped_by), signal.SIGTERM
                )
            )
            saved = [cb.saved for cb in stoppers if cb.saved]
            return StoppedBySignal(
                f"stopped by {signal.Signals(signum).name} at step {trainer.global_step}: "
                + (f"saved {saved[0]} (resume with --ckpt_path last)" if saved else "no checkpoint saved"),
                signum,
            )
        checkpoints = [cb.last_model_path for cb in trainer.checkpoint_callbacks if getattr(cb, "last_model_path", "")]
        message = lost_rank_message(
            err,
            rank=trainer.global_rank,
            step=trainer.global_step,
            collective_timeout=self.config.fit.collective_timeout,
            checkpoint=checkpoints[-1] if checkpoints else None,
        )
        return None if message is None else LostRank(message)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for key, title in CHECKPOINT_GROUPS.items():
            parser.add_lightning_class_args(ModelCheckpoint, key)
            parser.groups[key].title = title  # else both read ModelCheckpoint's "after every epoch"
            parser.link_arguments("trainer.default_root_dir", f"{key}.dirpath", compute_fn=checkpoint_dir)
        parser.add_lightning_class_args(CollapseMonitor, "collapse_monitor")
        parser.add_lightning_class_args(SkippedSamplesLogger, "skipped_samples")
        parser.link_arguments("data.init_args.batch_size", "model.init_args.batch_size")
        parser.add_argument(
            "--collective_timeout",
            type=float,
            default=DEFAULT_COLLECTIVE_TIMEOUT_S,
            help="seconds a rank waits for the others in a collective before the run stops: what a "
            f"hung rank costs; {MIN_COLLECTIVE_TIMEOUT_S:g} to {MAX_COLLECTIVE_TIMEOUT_S:.3f} "
            "(24.8 days; docs/multinode.md)",
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="Start a new run in a trainer.default_root_dir that holds another run's "
            "checkpoints: delete them, its logs and its curves first (without --overwrite such a "
            "folder is refused).",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, resume by itself when the launcher restarted the job (:func:`resume_after_restart`),
        then check the values users get wrong (:func:`check_fit_config`) before anything is built
        or seeded; a parser error names the ``--config`` file that set the key."""
        token = FIT_ARGS.set(tuple(args))
        try:
            super().parse_arguments(parser, args)
        finally:
            FIT_ARGS.reset(token)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config  # run=False: flat
        resume_after_restart(config)
        check_fit_config(config)
        check_collective_timeout(config.collective_timeout)
        if tracker := missing_tracker(str(config.trainer.get("logger"))):  # else "not a valid subclass of Logger"
            raise UserError(tracker)
        model = config.model.get("init_args") or Namespace()
        self.runtime_options = {key: model.get(key) for key in RUNTIME_OPTIONS if key in model}

    def before_instantiate_classes(self) -> None:
        """A resumed run keeps the config's :data:`RUNTIME_OPTIONS` (Lightning has just merged the
        checkpoint's hyper-parameters into the config: a compiled run resumes eager when asked).
        ``trainer.logger: null`` means a CSV logger in ``<default_root_dir>/logs``; trackers
        (``WandbLogger``, ``MLFlowLogger``, ...) get it beside them (:func:`with_csv_logger`). A
        strategy given as ``class_path`` gets ``--collective_timeout`` as its ``timeout``."""
        config = self.config[self.subcommand] if self.subcommand else self.config  # run=False: flat
        for key, value in getattr(self, "runtime_options", {}).items():  # the config's, not the resumed checkpoint's
            for part in ("init_args", "dict_kwargs"):  # where Lightning put the checkpoint's hyper-parameters
                if key in (config.model.get(part) or {}):
                    config.model[part][key] = value
        trainer = config.trainer
        trainer.logger = with_csv_logger(trainer.logger, trainer.default_root_dir or ".")
        if isinstance(trainer.strategy, Namespace):
            trainer.strategy = strategy_with_timeout(trainer.strategy, config.collective_timeout)

    def instantiate_classes(self) -> None:
        """An objective's own error while being built (an unreadable ``backbone_checkpoint``) is
        raised as itself: in subclass mode jsonargparse wraps it in union-validation errors, each
        raised by jsonargparse ``from`` the one below (:func:`raised_by`)."""
        try:
            super().instantiate_classes()
        except ValueError as err:
            cause: BaseException = err
            while cause.__cause__ is not None and raised_by(cause, "jsonargparse"):
                cause = cause.__cause__
            raise cause from None

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer, with plain progress lines instead of Lightning's bar when stdout is not a
        terminal (a job's log file; :mod:`locatdino.ssl.logs.progress`), ``trainer.precision
        16-mixed`` on the CPU training in fp16 as asked (:func:`fp16_on_cpu`), and a strategy named
        by a string built with ``--collective_timeout`` (:func:`strategy_with_timeout`)."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init  # run=False: flat
        trainer_config = config.get("trainer") or {}
        strategy = trainer_config.get("strategy", "auto")
        if isinstance(strategy, str):
            kwargs["strategy"] = strategy_with_timeout(
                strategy,
                config.collective_timeout,
                num_nodes=trainer_config.get("num_nodes") or 1,
                devices=trainer_config.get("devices", "auto"),
                accelerator=trainer_config.get("accelerator", "auto"),
            )
        if wants_line_progress({**trainer_config, **kwargs}):
            callbacks = kwargs.get("callbacks", trainer_config.get("callbacks")) or []
            kwargs["callbacks"] = [*(callbacks if isinstance(callbacks, list) else [callbacks]), LineProgressBar()]
        if fp16_on_cpu(trainer_config):
            plugins = trainer_config.get("plugins") or []
            plugins = plugins if isinstance(plugins, list) else [plugins]
            kwargs.update(precision=None, plugins=[*plugins, MixedPrecision("16-mixed", "cpu")])
        return super().instantiate_trainer(**kwargs)

    def before_fit(self) -> None:
        """A launch that cannot start all its ranks is refused (:func:`missing_launcher`);
        temporaries of checkpoint writes killed in an earlier start of this run are removed
        (with ``--overwrite`` on a fresh run, the earlier run's checkpoints, logs and curves too,
        by rank 0, before the other ranks start); an elastic job's rendezvous id is recorded
        (:func:`record_elastic_job`); the ranks will compare their configs before the first step
        (:class:`SameConfigOnEveryRank`); a SIGTERM will save ``last.ckpt`` (:class:`SigtermCheckpoint`).
        Rank 0 locks the run folder first (:attr:`run_folder`: until the run ends)."""
        self.fitting = True
        trainer = self.trainer
        if trainer.is_global_zero and "://" not in str(trainer.default_root_dir):  # not s3:// and the like
            self.run_folder.enter_context(output_lock(trainer.default_root_dir, "trainer.default_root_dir"))
        problem = missing_launcher(self.trainer, os.environ)
        if problem is not None:
            raise UserError(problem)
        config = self.config.fit
        if config.overwrite and config.ckpt_path is None and self.trainer.is_global_zero:
            remove_earlier_run(config.trainer.default_root_dir)
        if self.trainer.is_global_zero and "://" not in str(config.trainer.default_root_dir):
            record_elastic_job(config.trainer.default_root_dir)
        for key in CHECKPOINT_GROUPS:
            remove_stale_temporaries(config[key].dirpath)
        self.trainer.callbacks.append(SameConfigOnEveryRank(config))
        self.trainer.callbacks.append(SigtermCheckpoint(self.config.fit.step_checkpoint.dirpath))
        if takes_timeout(type(self.trainer.strategy)):
            os.environ.update(nccl_environment(config.collective_timeout, os.environ))

    def after_fit(self) -> None:
        """The run's curves, stitched over its log versions, as ``<default_root_dir>/curves.png``,
        also sent to every tracker of the run (:func:`log_image`)."""
        loggers = self.trainer.loggers
        csv = next((logger for logger in loggers if isinstance(logger, CSVLogger)), None)
        if not self.trainer.is_global_zero or csv is None:
            return
        curves = write_curves(csv.root_dir, os.path.join(csv.save_dir, CURVES_NAME))
        if curves is not None:
            for logger in loggers:
                log_image(logger, "curves", curves, self.trainer.global_step)


def fp16_on_cpu(trainer: Namespace | dict[str, Any]) -> bool:
    """Whether the instantiated ``trainer`` arguments ask for ``16-mixed`` on the CPU, where Lightning
    would switch to ``bf16-mixed`` with a warning lost among its start-up lines. torch has fp16
    autocast and a gradient scaler on the CPU, so ``fit`` gives the Trainer Lightning's
    ``MixedPrecision("16-mixed", "cpu")`` instead (FSDP keeps its own precision plugin)."""
    accelerator, strategy = trainer.get("accelerator", "auto"), trainer.get("strategy", "auto")
    if str(trainer.get("precision")) not in ("16", "16-mixed"):
        return False
    if isinstance(strategy, str) and strategy in StrategyRegistry:
        strategy = StrategyRegistry[strategy]["strategy"]
    if isinstance(strategy, FSDPStrategy) or (isinstance(strategy, type) and issubclass(strategy, FSDPStrategy)):
        return False
    if accelerator == "auto":
        return not (CUDAAccelerator.is_available() or MPSAccelerator.is_available())
    return accelerator == "cpu" or isinstance(accelerator, CPUAccelerator)


def raised_by(error: BaseException, package: str) -> bool:
    """Whether ``error`` was raised in ``package``'s code (the innermost frame of its traceback)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").partition(".")[0] == package


def remove_earlier_run(default_root_dir: str | None) -> None:
    """What ``--overwrite`` replaces in a run folder: its checkpoints, logs and ``curves.png``
    (stitched curves of two unrelated runs would read as one resumed run)."""
    root = default_root_dir or "."
    for name in earlier_checkpoints(root):
        os.remove(os.path.join(checkpoint_dir(root), name))
    shutil.rmtree(os.path.join(root, "logs"), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(root, CURVES_NAME))


def _names_objective(args: list[str]) -> bool:
    """Whether a flag or a ``--config`` file of ``args`` sets the model's ``class_path`` (every
    file is read here, so one that is not a YAML mapping is refused naming it)."""
    flag = any(
        arg in ("--model", "--model.class_path") or arg.startswith(("--model=", "--model.class_path=")) for arg in args
    )
    recipes = [read_config(path) for path in config_paths(args) if os.path.isfile(path)]
    return flag or any(isinstance(r.get("model"), dict) and "class_path" in r["model"] for r in recipes)


def _resolve_recipes(args: list[str]) -> list[str]:
    """Every ``--config`` value through :func:`locatdino.configs.resolve_recipe`."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + resolve_recipe(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = resolve_recipe(out[i + 1])
    return out


def build_cli(args: list[str], run: bool = True) -> FitCLI:
    """The ``FitCLI`` of ``locatdino fit`` over ``default.yaml``; ``run=False`` only parses
    and instantiates (``args`` then without the ``fit`` subcommand)."""
    if not DEFAULT_CONFIG.is_file():
        raise MissingDefaultConfigError(
            f"{DEFAULT_CONFIG} not found: the recipes ship inside the package, reinstall locatdino"
        )
    args = _resolve_recipes(args)
    if not _names_objective(args):  # DINO, whose init_args a recipe may then give without a class_path
        args = ["--model", DEFAULT_OBJECTIVE, *args]
    defaults = {"default_config_files": [str(DEFAULT_CONFIG)]}
    with warnings.catch_warnings():
        # args are always explicit (dispatcher, demo, tests): LightningCLI warns whenever the
        # process also has command-line arguments of its own
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        return FitCLI(
            PretrainingObjective,
            ShardDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=["fit", *args] if run else args,
            parser_kwargs={"prog": "locatdino", **({"fit": defaults} if run else defaults)},
            parser_class=FitArgumentParser,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,
            run=run,
        )


def main(argv: list[str]) -> int:
    """Run ``fit`` with ``argv`` (without the word ``fit``); returns the exit status."""
    try:
        build_cli(argv)
    except (FloatingPointError, MissingDefaultConfigError, UserError) as err:  # the message says what to do
        print(f"locatdino fit: {err}", file=sys.stderr)
        return 2 if isinstance(err, UsageError) else 1
    except StoppedBySignal as stop:
        if rank_zero_only.rank == 0:  # every rank stops at the same step with the same checkpoint
            print(f"locatdino fit: {stop}", file=sys.stderr)
        return stop_status(stop.signum)
    except LostRank as lost:  # each surviving rank says it: which ones survived is the news
        print(f"locatdino fit: {lost}", file=sys.stderr)
        return 1
    except Exception as err:  # a full disk, however deep torch or Lightning wrapped it
        message = disk_full_message(err)
        if message is None:
            raise
        print(f"locatdino fit: {message}", file=sys.stderr)
        return 1
    return 0
