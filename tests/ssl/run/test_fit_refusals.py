"""What ``locatdino fit`` refuses before any work, in one line: a checkpoint of another objective,
out-of-range objective options, a run folder it cannot write, config files it cannot use; and
``16-mixed`` on the CPU trains in fp16 as asked."""

import json

import pytest
import torch
from lightning.pytorch.plugins import MixedPrecision
from ssl_helpers import TINY_IBOT, ibot_overrides, tiny_overrides
from test_fit_cli import _fit_error

from locatdino.ssl.run import cli


def dino_overrides(tmp_path) -> list[str]:
    """The tiny DINO run on iBOT's tiny backbone (patch 8): it differs from ``ibot_overrides`` in
    its objective only."""
    args = tiny_overrides(tmp_path)
    args[args.index("--model.backbone_kwargs") + 1] = json.dumps(TINY_IBOT["backbone_kwargs"])
    return args


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One-step runs of both objectives: ``{"dino": run folder, "ibot": run folder}`` (DINO in 16-mixed)."""
    tmp = tmp_path_factory.mktemp("objectives")
    assert cli.main([*dino_overrides(tmp / "dino"), "--trainer.max_steps", "1", "--trainer.precision", "16-mixed"]) == 0
    assert cli.main([*ibot_overrides(tmp / "ibot"), "--trainer.max_steps", "1"]) == 0
    return {name: tmp / name / "run" for name in ("dino", "ibot")}


@pytest.mark.slow
def test_a_checkpoint_of_another_objective_is_refused(runs, tmp_path, capsys):
    """An iBOT config resumed a DINO checkpoint with rc 0 and trained DINO (the checkpoint's class
    won); a DINO config with ``--ckpt_path last`` in an iBOT run failed inside Lightning."""
    dino_last, ibot_last = (runs[name] / "checkpoints" / "last.ckpt" for name in ("dino", "ibot"))
    tail = "resume with the run's config, or start a new run from its weights with --model.backbone_checkpoint"
    status, err = _fit_error(capsys, [*ibot_overrides(tmp_path), "--ckpt_path", str(dino_last)])
    assert status == 1 and err == (
        f"locatdino fit: ckpt_path {dino_last} holds a locatdino.ssl.DINOModule run, the "
        f"config trains locatdino.ssl.IBOTModule (model.class_path): {tail}"
    )
    status, err = _fit_error(
        capsys, [*dino_overrides(tmp_path), "--trainer.default_root_dir", str(runs["ibot"]), "--ckpt_path", "last"]
    )
    assert status == 1 and err == (
        f"locatdino fit: ckpt_path {ibot_last} holds a locatdino.ssl.IBOTModule run, the "
        f"config trains locatdino.ssl.DINOModule (model.class_path): {tail}"
    )
    status, err = _fit_error(
        capsys,
        [
            "--config",
            "sup_tiny_cpu",
            "--trainer.default_root_dir",
            str(tmp_path / "sup"),
            "--ckpt_path",
            str(dino_last),
        ],
    )
    assert status == 1 and err.startswith(
        f"locatdino fit: ckpt_path {dino_last} holds a locatdino.ssl.DINOModule "
        "run, the config trains locatdino.ssl.SupervisedModule"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no shards, no run folder


@pytest.mark.slow
def test_16_mixed_on_the_cpu_trains_in_fp16(runs, tmp_path):
    """Lightning switched 16-mixed on the CPU to bf16-mixed (one warning among its start-up lines):
    the Trainer now autocasts to fp16 with a gradient scaler, whose state the checkpoint keeps."""
    built = cli.build_cli([*dino_overrides(tmp_path), "--trainer.precision", "16-mixed"], run=False)
    plugin = built.trainer.precision_plugin
    assert isinstance(plugin, MixedPrecision) and plugin.precision == "16-mixed" and plugin.device == "cpu"
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    saved = torch.load(runs["dino"] / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["MixedPrecision"]["scale"] > 0 and saved["global_step"] == 1
    bf16 = cli.build_cli([*dino_overrides(tmp_path), "--trainer.precision", "bf16-mixed"], run=False)
    assert bf16.trainer.precision_plugin.precision == "bf16-mixed"  # what else is asked stays Lightning's


OPTION_ERRORS = {  # on the tiny iBOT run: 4 x 4 tokens per 32 px global crop, 8 global crops per step
    "patch_out_dim 0": (["--model.patch_out_dim", "0"], "model.patch_out_dim: must be at least 1, got 0"),
    "negative teacher_patch_temp": (
        ["--model.teacher_patch_temp", "-0.07"],
        "model.teacher_patch_temp: must be a positive number, got -0.07",
    ),
    "teacher_patch_temp 0": (
        ["--model.teacher_patch_temp", "0"],
        "model.teacher_patch_temp: must be a positive number, got 0.0",
    ),
    "negative ibot_loss_weight": (
        ["--model.ibot_loss_weight", "-1"],
        "model.ibot_loss_weight: must be a number >= 0, got -1.0",
    ),
    "both weights 0": (
        ["--model.ibot_loss_weight", "0", "--model.dino_loss_weight", "0"],
        "model.dino_loss_weight and model.ibot_loss_weight: both 0, nothing would be learned",
    ),
    "sinkhorn_iterations 0": (
        ["--model.patch_centering", "sinkhorn_knopp", "--model.sinkhorn_iterations", "0"],
        "model.sinkhorn_iterations: must be at least 1 with model.patch_centering sinkhorn_knopp, got 0",
    ),
    "mask_min_patches": (
        ["--model.mask_min_patches", "9"],
        "model.mask_min_patches: 9 patches do not fit one block on the 4 x 4 token grid of the "
        "32 px global crops (at most 8: blocks are smaller than the grid and than mask_ratio's "
        "high 0.5 of its 16 tokens); use at most 8",
    ),
    "mask_ratio reversed": (
        ["--model.mask_ratio", "[0.6, 0.2]"],
        "model.mask_ratio: must be [low, high] with 0 <= low <= high <= 1, got [0.6, 0.2]",
    ),
    "no crop masked": (
        ["--model.mask_probability", "0.1"],
        "model.mask_probability: 0.1 of the 8 global crops of a step (per rank) masks none of them; use at least 0.125",
    ),
    "mask_probability 2": (["--model.mask_probability", "2"], "model.mask_probability: must be in [0, 1], got 2.0"),
    "teacher_temp 0": (["--model.teacher_temp", "0"], "model.teacher_temp: must be a positive number, got 0.0"),
    "momentum above 1": (["--model.momentum_teacher", "1.5"], "model.momentum_teacher: must be in [0, 1], got 1.5"),
    "out_dim 0": (["--model.out_dim", "0"], "model.out_dim: must be at least 1, got 0"),
}


@pytest.mark.parametrize(("args", "expected"), list(OPTION_ERRORS.values()), ids=list(OPTION_ERRORS))
def test_out_of_range_options_are_refused_before_anything_is_built(tmp_path, capsys, args, expected):
    status, err = _fit_error(capsys, [*ibot_overrides(tmp_path), *args])
    assert status == 1 and err.startswith(f"locatdino fit: {expected}"), err
    assert list(tmp_path.iterdir()) == []


def test_the_largest_block_that_fits_is_accepted(tmp_path):
    built = cli.build_cli([*ibot_overrides(tmp_path), "--model.mask_min_patches", "8"], run=False)
    assert built.model.masking.min_patches == 8


def test_a_run_folder_that_cannot_be_written_is_named(tmp_path, capsys):
    """The folder's path runs through a file: a raw ``[Errno 20]`` once the Trainer was built."""
    (tmp_path / "notes").write_text("mine")
    status, err = _fit_error(
        capsys, [*tiny_overrides(tmp_path), "--trainer.default_root_dir", str(tmp_path / "notes" / "run")]
    )
    assert status == 1 and err == (
        f"locatdino fit: trainer.default_root_dir '{tmp_path / 'notes' / 'run'}': folder "
        f"{tmp_path / 'notes'} is a file, not a folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


@pytest.mark.slow
def test_a_read_only_run_folder_is_named_before_any_work(tmp_path):
    """A read-only filesystem gave ``[Errno 30] Read-only file system: '…/run'``, naming no option."""
    from tests.tiny_disk import python, run_on_tiny_disk

    disk = tmp_path / "disk"
    proc = run_on_tiny_disk(
        disk,
        "64k",
        python("-m", "locatdino", "fit", *tiny_overrides(tmp_path), "--trainer.default_root_dir", str(disk / "run")),
        read_only=True,
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"locatdino fit: trainer.default_root_dir '{disk / 'run'}': folder {disk} is not writable: "
        "Read-only file system"
    )
    assert not (tmp_path / "shards").exists()


CONFIG_ERRORS = {
    "not YAML": (
        "model: [1\n",
        1,
        "{path}: not valid YAML (expected ',' or ']', but got '<stream end>' at line 2, column 1)",
    ),
    "a list": (
        "- model\n- data\n",
        1,
        "{path} holds a list, not a mapping: a config is a mapping of keys (model:, data:, trainer:, ...)",
    ),
    "empty": ("", 1, "{path} is empty: a config is a mapping of keys (model:, data:, trainer:, ...)"),
    "typo in model": ("model:\n  lrr: 0.1\n", 2, "{path}: model.lrr: not an option of locatdino.ssl.DINOModule"),
    "typo in iBOT": (
        "model:\n  class_path: locatdino.ssl.IBOTModule\n  init_args:\n    mask_ratioo: [0.1, 0.2]\n",
        2,
        "{path}: model.init_args.mask_ratioo: not an option of locatdino.ssl.IBOTModule",
    ),
    "typo in trainer": ("trainer:\n  max_stepz: 3\n", 2, "{path}: trainer.max_stepz: no such option"),
    "string for a number": (
        "data:\n  init_args:\n    batch_size: many\n",
        2,
        "{path}: data.init_args.batch_size: Expected a <class 'int'>. Got value: many",
    ),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS, ids=list(CONFIG_ERRORS))
def test_config_file_errors_name_the_file_and_the_key(tmp_path, capsys, case):
    """Each was a page of usage, a parser traceback, or a line naming no file (``model: Does not
    validate against any of the Union subtypes`` for a misspelt option)."""
    text, status, expected = CONFIG_ERRORS[case]
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    got_status, err = _fit_error(capsys, ["--config", str(path), "--trainer.default_root_dir", str(tmp_path / "run")])
    assert got_status == status and err.startswith("locatdino fit: --config " + expected.format(path=path)), err


def test_a_misspelt_flag_names_the_option(tmp_path, capsys):
    status, err = _fit_error(capsys, [*tiny_overrides(tmp_path), "--model.lrr", "0.1"])
    assert status == 2 and err == (
        "locatdino fit: model.init_args.lrr: not an option of locatdino.ssl.DINOModule "
        "(locatdino fit --help lists the options)"
    )


@pytest.mark.parametrize(("value", "expected"), [("0.001", "0.001 s is below 5 s"), ("1e15", "1e+15 s is above")])
def test_a_collective_timeout_out_of_range_is_refused_before_anything_is_built(tmp_path, capsys, value, expected):
    status, err = _fit_error(capsys, [*dino_overrides(tmp_path), "--collective_timeout", value])
    assert status == 1 and err.startswith(f"locatdino fit: collective_timeout: {expected}"), err
    assert list(tmp_path.iterdir()) == []
