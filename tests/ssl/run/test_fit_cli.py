"""``locatdino fit`` / ``locatdino export`` end to end (in-process), and every recipe parses."""

import csv
import json
import os
from pathlib import Path

import pytest
import timm
import torch
from jsonargparse import Namespace
from ssl_helpers import ROOT, TINY_MODEL, tiny_overrides

from locatdino import cli as command_line
from locatdino.ssl.export import cli as export
from locatdino.ssl.run import cli

RECIPES = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_parses_on_top_of_the_defaults(recipe, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--config", str(ROOT / "configs" / recipe), "--print_config"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "backbone:" in out and "step_checkpoint:" in out and "AtomicCheckpointIO" in out


def test_batch_size_is_linked_and_default_keys_survive():
    """The instantiated run: model.batch_size follows data.batch_size, and keys only
    configs/default.yaml sets (the classes' defaults differ) reach the objects."""
    built = cli.build_cli(
        [
            "--config",
            str(ROOT / "configs" / "dino_small_ddp.yaml"),
            "--data.init_args.batch_size",
            "12",
            "--data.init_args.synthetic",
            "8",  # no ImageNet shards here: checked before building
            "--trainer.devices",
            "1",
            "--trainer.accelerator",
            "cpu",
            "--model.backbone_kwargs",
            json.dumps(TINY_MODEL["backbone_kwargs"]),
            "--model.out_dim",
            "128",
        ],
        run=False,
    )
    assert built.datamodule.batch_size == built.model.hparams.batch_size == 12
    assert built.datamodule.resampled is True and built.datamodule.num_workers == 10  # class: False, 8
    assert built.trainer.log_every_n_steps == 10  # Lightning: 50
    assert built.model.hparams.norm_last_layer is True  # the 100-epoch ViT-S/16 reference run's


def test_missing_default_config_is_one_clear_line(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "configs" / "default.yaml"
    monkeypatch.setattr(cli, "DEFAULT_CONFIG", missing)
    assert cli.main(["--config", str(ROOT / "configs" / "dino_tiny_cpu.yaml"), "--print_config"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"locatdino fit: {missing} not found") and "reinstall locatdino" in err and "\n" not in err


def test_recipes_resolve_by_name_from_any_folder(tmp_path, monkeypatch):
    """README's ``--config configs/x.yaml`` and a bare recipe name find the shipped recipe outside
    a checkout; an existing file wins; anything else is left for the parser to report."""
    from locatdino.configs import CONFIG_DIR, recipes, resolve_recipe

    assert recipes() == [
        "dino_large_fsdp",
        "dino_small_ddp",
        "dino_tiny_cpu",
        "distill_small_ddp",
        "distill_tiny_cpu",
        "ibot_small_ddp",
        "ibot_tiny_cpu",
        "sup_small_ddp",
        "sup_tiny_cpu",
    ]
    assert (ROOT / "configs").resolve() == CONFIG_DIR  # the checkout's configs/ is the package's
    monkeypatch.chdir(tmp_path)
    shipped = str(CONFIG_DIR / "dino_tiny_cpu.yaml")
    assert [resolve_recipe(v) for v in ("dino_tiny_cpu", "dino_tiny_cpu.yaml", "configs/dino_tiny_cpu.yaml")] == [
        shipped
    ] * 3
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "dino_tiny_cpu.yaml").write_text("model: {lr: 0.1}\n")  # a user's own file wins
    assert resolve_recipe("configs/dino_tiny_cpu.yaml") == "configs/dino_tiny_cpu.yaml"
    assert resolve_recipe("other/dino_tiny_cpu.yaml") == "other/dino_tiny_cpu.yaml"
    assert resolve_recipe("no_such_recipe") == "no_such_recipe"
    built = cli.build_cli(
        ["--config=dino_tiny_cpu", "--model.backbone", "locatvit_tiny_patch8_224", "--data.init_args.batch_size", "3"],
        run=False,
    )
    assert built.model.hparams.backbone == "locatvit_tiny_patch8_224" and built.datamodule.batch_size == 3


@pytest.mark.slow
def test_configs_ship_in_a_non_editable_install(tmp_path):
    """A wheel built from the sources holds every recipe, and ``fit`` finds them with no checkout."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(ROOT / "locatdino", src / "locatdino", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("locatdino-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    shipped = sorted(p.name for p in (tmp_path / "site" / "locatdino" / "configs").glob("*.yaml"))
    assert shipped == sorted(p.name for p in (ROOT / "configs").glob("*.yaml")) and "default.yaml" in shipped
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "locatdino", "fit", "--config", "configs/dino_tiny_cpu.yaml", "--print_config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONPATH": str(tmp_path / "site"), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "backbone: vit_tiny_patch16_224" in proc.stdout and "step_checkpoint:" in proc.stdout


def _metrics(run: Path, version: int) -> list[dict]:
    return list(csv.DictReader(open(run / "logs" / f"version_{version}" / "metrics.csv")))


@pytest.mark.slow
def test_fit_resume_export_and_nonfinite_stop(tmp_path, capsys):
    args = tiny_overrides(tmp_path)
    run = tmp_path / "run"
    assert cli.main([*args, "--trainer.max_steps", "4"]) == 0
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 4
    rows = _metrics(run, 0)
    for key in (
        "train/loss",
        "train/lr",
        "train/wd",
        "train/teacher_momentum",
        "train/teacher_temp",
        "teacher/entropy",
        "teacher/batch_entropy",
    ):
        assert sum(bool(r.get(key)) for r in rows) == 4, key
    assert (run / "logs" / "version_0" / "config.yaml").is_file()

    # resume: step counter, then two more steps logged in a new log version
    assert cli.main([*args, "--trainer.max_steps", "6", "--ckpt_path", "last"]) == 0
    assert torch.load(last, weights_only=True)["global_step"] == 6
    assert [int(r["step"]) for r in _metrics(run, 1) if r.get("train/loss")] == [4, 5]
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"  # stitched over version_0 and version_1

    # export: a plain timm state dict of the teacher
    out = tmp_path / "teacher.pth"
    assert export.main([str(last), str(out)]) == 0
    state = torch.load(out, weights_only=True)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"])
    model.load_state_dict(state, strict=True)
    ckpt = torch.load(last, weights_only=True)["state_dict"]
    assert torch.equal(state["blocks.1.mlp.fc2.weight"], ckpt["teacher.backbone.blocks.1.mlp.fc2.weight"])

    # a non-finite loss at step 7 stops with exit status 1; last.ckpt stays a finite state from before it
    # (Lightning replays the end of epoch 0, saved at step 6, after one more batch: step 7)
    capsys.readouterr()
    poison = [
        "--trainer.callbacks+=ddp_helpers.NaNBatch",
        "--trainer.callbacks.rank",
        "0",
        "--trainer.callbacks.step",
        "7",
    ]
    assert cli.main([*args, "--trainer.max_steps", "9", "--ckpt_path", "last", *poison]) == 1
    err = capsys.readouterr().err
    assert "not finite at step 7" in err and "here nan" in err and str(last) in err
    kept = torch.load(last, weights_only=True)
    assert kept["global_step"] in (6, 7)
    assert all(torch.isfinite(v).all() for v in kept["state_dict"].values())


@pytest.mark.slow
@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGUSR1", 138)])
def test_sigterm_saves_last_checkpoint_and_exits_non_zero(tmp_path, capsys, name, status):
    """A scheduler's SIGTERM at step 2 once ended fit with exit status 0 and the step-2 state
    unsaved, SIGUSR1 (outside SLURM) killed it with 138 and no line: now last.ckpt holds the stop's
    step (3; the periodic one would be 2), one line says so, exit status 128 + the signal, and
    ``--ckpt_path last`` continues from it. (Through the dispatcher, which holds every command's
    stop signals.)"""
    args = [*tiny_overrides(tmp_path), "--trainer.max_steps", "10"]
    stop = [
        "--trainer.callbacks+=ddp_helpers.SigtermAt",
        "--trainer.callbacks.step",
        "2",
        "--trainer.callbacks.signal",
        name,
    ]
    assert command_line.main(["fit", *args, *stop]) == status
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"locatdino fit: stopped by {name} at step 3: saved {last} (resume with --ckpt_path last)"
    )
    assert torch.load(last, weights_only=True)["global_step"] == 3
    assert cli.main([*tiny_overrides(tmp_path), "--trainer.max_steps", "4", "--ckpt_path", "last"]) == 0
    assert [int(r["step"]) for r in _metrics(tmp_path / "run", 1) if r.get("train/loss")] == [3]


@pytest.mark.slow
def test_slurm_requeue_signal_without_scontrol_saves_and_says_the_requeue_failed(tmp_path, capsys, monkeypatch):
    """One SLURM task whose node has no ``scontrol`` on PATH: the requeue signal at step 2 saves
    last.ckpt, then the documented failure line (it was ``[Errno 2] No such file or directory:
    'scontrol'``); training goes on to its end."""
    slurm = {
        "SLURM_JOB_ID": "4711",
        "SLURM_JOB_NAME": "locatdino-fit",
        "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_STEP_ID": "0",
        "PATH": str(tmp_path / "empty"),
    }
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    args = [
        *tiny_overrides(tmp_path),
        "--trainer.max_steps",
        "4",
        "--trainer.callbacks+=ddp_helpers.SigtermAt",
        "--trainer.callbacks.step",
        "2",
        "--trainer.callbacks.signal",
        "SIGUSR1",
    ]
    assert command_line.main(["fit", *args]) == 0
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("locatdino fit:")] == [
        f"locatdino fit: requeue signal at step 3: saved {last}; `scontrol requeue 4711` failed (scontrol: No such "
        "file or directory): the job will not start again by itself"
    ]
    assert torch.load(last, weights_only=True)["global_step"] == 4


@pytest.mark.slow
def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path):
    """On a 4 MiB tmpfs the step-2 checkpoint (2.7 MB) fits and the step-4 one does not: one line
    naming the file, exit 1, the step-2 checkpoint intact and no temporary left."""
    from tests.tiny_disk import python, run_on_tiny_disk

    disk = tmp_path / "disk"
    args = [*tiny_overrides(tmp_path), "--trainer.default_root_dir", str(disk / "run"), "--trainer.max_steps", "4"]
    check = (
        "import os, sys, torch; c = sys.argv[1] + '/run/checkpoints'; "
        "print(sorted(os.listdir(c)), torch.load(c + '/last.ckpt', weights_only=True)['global_step'])"
    )
    script = 'd=$1; shift; "$@"; rc=$?; ' + " ".join(python()) + ' -c "$0" "$d"; exit $rc'
    proc = run_on_tiny_disk(
        disk, "4m", ["sh", "-c", script, check, str(disk), *python("-m", "locatdino", "fit"), *args]
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "inline_container" not in proc.stderr
    last = disk / "run" / "checkpoints" / "last.ckpt"
    assert (
        proc.stderr.strip().splitlines()[-1] == f"locatdino fit: {last}: No space left on device (nothing was replaced)"
    )
    assert proc.stdout.strip().splitlines()[-1] == "['last.ckpt'] 2"


def test_stale_checkpoint_temporaries_are_removed_at_start(tmp_path):
    from locatdino.common.output_files import _HOST

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    stale = ckpts / f".last.ckpt.999999999@{_HOST}.0123abcd.tmp"  # beyond pid_max: a dead writer
    stale.write_bytes(b"half a checkpoint")
    built = cli.build_cli(
        ["--config", str(ROOT / "configs" / "dino_tiny_cpu.yaml"), "--trainer.default_root_dir", str(tmp_path / "run")],
        run=False,
    )
    assert stale.exists()  # parsing alone touches nothing
    built.config = Namespace(fit=built.config)
    built.before_fit()
    assert list(ckpts.iterdir()) == []


def test_export_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_text("not a checkpoint")
    assert export.main([str(bad), str(tmp_path / "out.pth")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"locatdino export: {bad}") and "\n" not in err
    assert not (tmp_path / "out.pth").exists()


def test_export_reads_a_full_dino_training_checkpoint(tmp_path, capsys):
    """DINO's main_dino.py saves ``args`` (an argparse.Namespace) next to the networks, DDP's
    ``module.`` prefix on the student: export must read it with weights_only=True."""
    import argparse

    torch.manual_seed(0)
    backbone = timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY_MODEL["backbone_kwargs"])
    teacher = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    teacher["head.last_layer.weight_g"] = torch.ones(8, 1)
    student = {f"module.{k}": torch.zeros_like(v) for k, v in teacher.items()}
    ckpt = tmp_path / "checkpoint.pth"
    torch.save({"student": student, "teacher": teacher, "epoch": 3, "args": argparse.Namespace(arch="vit_tiny")}, ckpt)

    out = tmp_path / "teacher.pth"
    from locatdino.common.output_files import _HOST

    stale = tmp_path / f".teacher.pth.999999999@{_HOST}.0123abcd.tmp"  # an export killed mid-write
    stale.write_bytes(b"half")
    assert export.main([str(ckpt), str(out)]) == 0, capsys.readouterr().err
    assert not stale.exists()
    state = torch.load(out, weights_only=True)
    assert state.keys() == backbone.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in backbone.state_dict().items())
    assert export.main([str(ckpt), str(out), "--which", "student", "--overwrite"]) == 0
    assert all(v.abs().sum() == 0 for v in torch.load(out, weights_only=True).values())


def _fit_error(capsys, args: list[str]) -> tuple[int, str]:
    """``locatdino fit ARGS`` through the dispatcher: (exit status, its single stderr line)."""
    capsys.readouterr()
    try:
        status = command_line.main(["fit", *args])
    except SystemExit as done:  # the parser's usage errors
        status = done.code
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return status, err.strip()


FIT_ERRORS = {
    "batch size 0": (
        ["--data.init_args.batch_size", "0"],
        1,
        "locatdino fit: data.init_args.batch_size: must be at least 1, got 0",
    ),
    "negative batch size": (
        ["--data.init_args.batch_size", "-3"],
        1,
        "locatdino fit: data.init_args.batch_size: must be at least 1, got -3",
    ),
    "not a number": (
        ["--data.init_args.batch_size", "abc"],
        2,
        "locatdino fit: data.init_args.batch_size: "
        "Expected a <class 'int'>. Got value: abc (locatdino fit --help lists the options)",
    ),
    "unknown option": (
        ["--trainer.max_stepz", "3"],
        2,
        "locatdino fit: unrecognized arguments: --trainer.max_stepz 3 (locatdino fit --help lists the options)",
    ),
    "crop size": (
        ["--data.init_args.multicrop.local_crop_size", "40"],
        1,
        "locatdino fit: data.init_args.multicrop.local_crop_size: 40 px is not a multiple of the patch "
        "size 16 of vit_tiny_patch16_224 (use 32 or 48)",
    ),
    "unknown model": (
        ["--model.backbone", "vit_tiny_patch16_22"],
        1,
        "locatdino fit: model.backbone: unknown model 'vit_tiny_patch16_22' (did you mean vit_tiny_patch16_224",
    ),
    "pretrained tag": (
        ["--model.backbone", "vit_small_patch16_224.dino"],
        1,
        "locatdino fit: model.backbone: vit_small_patch16_224.dino names timm's pretrained weights 'dino'",
    ),
    "wrong kwarg": (
        ["--model.backbone_kwargs", '{"depht": 2}'],
        1,
        "locatdino fit: model.backbone_kwargs "
        "{'depht': 2} for vit_tiny_patch16_224: VisionTransformer.__init__() "
        "got an unexpected keyword argument 'depht'",
    ),
    "missing checkpoint": (
        ["--model.backbone_checkpoint", "teacher.pht"],
        1,
        "locatdino fit: model.backbone_checkpoint: no such file or folder 'teacher.pht'",
    ),
    "missing resume file": (
        ["--ckpt_path", "runs/x/last.ckpt"],
        1,
        "locatdino fit: ckpt_path: no such file 'runs/x/last.ckpt'",
    ),
    "negative lr": (
        ["--model.lr", "-1"],
        1,
        "locatdino fit: model.lr: must be a positive number, got -1.0 "
        "(a negative lr trains by gradient ascent, 0 trains nothing)",
    ),
    "zero lr": (["--model.lr", "0"], 1, "locatdino fit: model.lr: must be a positive number, got 0.0"),
    "nan lr": (
        ["--model.lr", "nan"],
        2,
        "locatdino fit: model.init_args.lr: Expected a <class 'float'>. Got value: nan",
    ),
}


@pytest.mark.parametrize("case", FIT_ERRORS, ids=list(FIT_ERRORS))
def test_fit_errors_are_one_line_before_anything_is_built(tmp_path, capsys, case):
    args, status, expected = FIT_ERRORS[case]
    got_status, err = _fit_error(capsys, [*tiny_overrides(tmp_path), *args])
    assert got_status == status and err.startswith(expected), err
    assert not (tmp_path / "shards").exists() and not (tmp_path / "run").exists()  # nothing written


def test_fit_missing_shards_and_unreadable_checkpoint(tmp_path, capsys):
    args = [*tiny_overrides(tmp_path), "--data.init_args.synthetic", "0"]
    status, err = _fit_error(capsys, [*args, "--data.init_args.train_urls", str(tmp_path / "in1k")])
    assert status == 1 and err == (
        f"locatdino fit: data.init_args.train_urls: no shards match '{tmp_path / 'in1k'}' "
        f"(write shards there with `locatdino shards SOURCE {tmp_path / 'in1k'}`)"
    )
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"an image, not a shard")
    status, err = _fit_error(capsys, [*args, "--data.init_args.train_urls", str(tmp_path / "photos")])
    assert status == 1 and err == (  # never into the user's image folder
        f"locatdino fit: data.init_args.train_urls: no shards match '{tmp_path / 'photos'}' (a folder of images? "
        f"write its shards into a folder of their own: `locatdino shards {tmp_path / 'photos'} "
        f"{tmp_path / 'photos'}-shards`)"
    )
    (tmp_path / "teacher.pth").write_bytes(b"")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard-000000.tar").write_bytes(b"")
    status, err = _fit_error(capsys, [*args, "--model.backbone_checkpoint", str(tmp_path / "teacher.pth")])
    assert status == 1 and err.startswith(f"locatdino fit: {tmp_path / 'teacher.pth'}: is empty (0 bytes)"), err


def test_resume_checkpoints_are_checked_before_anything_is_built(tmp_path, capsys):
    """``--ckpt_path last`` with nothing to resume once trained from scratch; a plain state dict
    failed after the Trainer started (KeyError 'pytorch-lightning_version'); a checkpoint of
    another model silently replaced the config's (Lightning takes its hyper-parameters)."""
    args = tiny_overrides(tmp_path)
    root, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    status, err = _fit_error(capsys, [*args, "--ckpt_path", "last"])
    assert status == 1 and err == (
        f"locatdino fit: ckpt_path last: no last.ckpt in {ckpts} to resume "
        f"(trainer.default_root_dir '{root}'): leave --ckpt_path out to start a new run"
    )
    plain = tmp_path / "teacher.pth"
    torch.save({"cls_token": torch.zeros(1, 1, 64)}, plain)
    status, err = _fit_error(capsys, [*args, "--ckpt_path", str(plain)])
    assert status == 1 and err == (
        f"locatdino fit: ckpt_path {plain}: not a locatdino fit checkpoint (no Lightning "
        "training state; a plain state dict or an export?): start from its weights with "
        "--model.backbone_checkpoint"
    )
    ckpts.mkdir(parents=True)
    hparams = {
        "backbone": "locatvit_tiny_patch8_224",
        "backbone_kwargs": TINY_MODEL["backbone_kwargs"],
        "out_dim": 128,
        "lr": 0.5,
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
    }
    torch.save(
        {"pytorch-lightning_version": "2.6.6", "hyper_parameters": hparams, "state_dict": {}}, ckpts / "last.ckpt"
    )
    status, err = _fit_error(capsys, [*args, "--ckpt_path", "last"])
    assert status == 1 and err == (
        f"locatdino fit: ckpt_path {ckpts / 'last.ckpt'} was trained with other settings "
        "(model.backbone: 'locatvit_tiny_patch8_224' in the checkpoint, 'vit_tiny_patch16_224' in the "
        "config; model.lr: 0.5 in the checkpoint, 0.002 in the config): resume with the "
        "run's config, or start a new run from its weights with --model.backbone_checkpoint"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "teacher.pth"]  # no shards, no logs
    assert [p.name for p in root.iterdir()] == ["checkpoints"]


def test_a_second_fit_into_one_run_folder_is_refused(tmp_path, capsys):
    from locatdino.common.output_files import output_lock

    with output_lock(tmp_path / "run", "trainer.default_root_dir"):  # a first fit, still training
        status = cli.main([*tiny_overrides(tmp_path), "--trainer.max_steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()
    assert status == 1 and err.startswith(
        f"locatdino fit: trainer.default_root_dir {tmp_path / 'run'} is in use by another run (pid {os.getpid()} on "
    )


@pytest.mark.slow
def test_a_fresh_fit_never_replaces_another_runs_checkpoints(tmp_path, capsys):
    """A fresh ``fit`` (no ``--ckpt_path``) into a folder holding another run's checkpoints
    replaced its ``last.ckpt`` with rc 0; now it is refused unless ``--overwrite``, which replaces
    that run whole (no epoch file, log or curve of it left to mix with the new run's)."""
    args = tiny_overrides(tmp_path)
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    earlier = {"last.ckpt": b"earlier run, last", "epoch0007.ckpt": b"earlier run, epoch 7"}
    for name, data in earlier.items():
        (ckpts / name).write_bytes(data)
    (tmp_path / "run" / "logs" / "version_0").mkdir(parents=True)
    status, err = _fit_error(capsys, [*args, "--trainer.max_steps", "1"])
    assert status == 1 and err == (
        f"locatdino fit: trainer.default_root_dir '{tmp_path / 'run'}' already holds another "
        "run's checkpoints (epoch0007.ckpt, last.ckpt): resume that run with --ckpt_path "
        "last, give this one another --trainer.default_root_dir, or pass --overwrite to "
        "replace it"
    )
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == earlier and not (tmp_path / "shards").exists()

    assert cli.main([*args, "--trainer.max_steps", "1", "--overwrite"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["epoch0000.ckpt", "last.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 1
    assert [p.name for p in (tmp_path / "run" / "logs").iterdir()] == ["version_0"]
    assert len(_metrics(tmp_path / "run", 0)) >= 1  # the new run's log, not the empty earlier one


@pytest.mark.parametrize("objective", ["DINOModule", "SupervisedModule", "IBOTModule"])
def test_every_model_option_has_help_text(capsys, monkeypatch, objective):
    """The objectives' docstrings document one argument per line, so the parser gives each
    ``--model.*`` option its sentence (grouped entries gave 18 of 25 none)."""
    import inspect
    import re

    from locatdino import ssl

    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        cli.main(["--model.help", f"locatdino.ssl.{objective}"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    helps = {}
    for entry in re.split(r"\n(?=  -)", text):  # one entry per option
        words = entry.split()
        if words and words[0].startswith("--model."):
            metavar = 2 if len(words) > 1 and re.fullmatch(r"[A-Z_]+|\{[\w,]+\}", words[1]) else 1
            helps[words[0].removeprefix("--model.")] = " ".join(words[metavar:]).split("(type:")[0].strip()
    linked = {"batch_size"}  # set through data.init_args.batch_size, not an option of its own
    # a subclass passing **kwargs on (IBOTModule) has its parent's arguments too
    classes = [c for c in getattr(ssl, objective).__mro__ if issubclass(c, ssl.PretrainingObjective)]
    params = {n for c in classes for n, p in inspect.signature(c).parameters.items() if p.kind != p.VAR_KEYWORD}
    assert set(helps) == params
    assert [name for name, help_ in helps.items() if not help_ and name not in linked] == []
    assert f"per {512 if objective == 'SupervisedModule' else 256} images" in helps["lr"]


def _commands_in_config_comments() -> list[list[str]]:
    """Every ``locatdino ...`` command line shown in a comment of configs/*.yaml, as argv."""
    import re
    import shlex

    found = []
    for recipe in RECIPES:
        for line in (ROOT / "configs" / recipe).read_text().splitlines():
            match = re.match(r"#\s+(?:srun\s+)?locatdino\s+(\w+)\s+([^#]*)", line)
            if match:
                found.append([match.group(1), *shlex.split(match.group(2))])
    return found


@pytest.mark.parametrize("argv", _commands_in_config_comments(), ids=lambda a: " ".join(a))
def test_commands_in_config_comments_run(argv, monkeypatch, capsys):
    """The commands the recipes tell users to run are valid: ``fit`` parses (up to printing the
    merged config), ``shards`` reaches the writer with its source and output folder."""
    from locatdino.data.shards import cli as shards_cli

    monkeypatch.chdir(ROOT)
    command, args = argv[0], argv[1:]
    if command == "fit":
        with pytest.raises(SystemExit) as done:
            cli.main([*args, "--print_config"])
        assert done.value.code == 0, capsys.readouterr().err
        return
    assert command == "shards"
    calls = []
    monkeypatch.setattr(shards_cli, "build_source", lambda source, *rest: calls.append(source) or source)
    monkeypatch.setattr(
        shards_cli,
        "write_shards",
        lambda src, out, **kw: (
            calls.append(out) or {"num_samples": 0, "num_shards": 0, "total_bytes": 0, "seconds": 0, "urls": "x"}
        ),
    )
    assert shards_cli.main(args) == 0, capsys.readouterr().err
    assert calls == [a for a in args if not a.startswith("-") and not a.isdigit()]
