import json
import re
from datetime import UTC

import pytest
import timm
import torch

from locatdino.evaluation.hbird import cli
from locatdino.evaluation.hbird.options import HBIRD_TABLE, config_from_args
from locatdino.evaluation.options import encoder_device
from tests.evaluation.results_schema import valid_results

TINY = [
    "--num-train",
    "6",
    "--num-val",
    "2",
    "--scene-size",
    "64",
    "--input-size",
    "64",
    "--workers",
    "0",
    "--no-progress",
    "--k",
    "10",
]


@pytest.mark.slow
def test_compares_two_checkpoints_of_one_model(tmp_path, capsys):
    torch.manual_seed(1)
    ckpt = tmp_path / "dino_vitt.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), ckpt)
    out = tmp_path / "out"
    argv = ["--model", f"vit_tiny_patch16_224:{ckpt}", "--model", "vit_tiny_patch16_224:none", "--out", str(out), *TINY]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "| vit_tiny_patch16_224-dino_vitt |" in table and "| vit_tiny_patch16_224 |" in table
    runs = {r["model"]["label"]: r for r in valid_results(out / "results.json", "hbird")["models"]}
    assert list(runs) == ["vit_tiny_patch16_224-dino_vitt", "vit_tiny_patch16_224"]
    run = runs["vit_tiny_patch16_224-dino_vitt"]
    assert run["model"]["checkpoint"] == str(ckpt) and run["config"]["dataset"] == "scenes"
    assert run["num_train"] == 6 and run["memory_patches"] > 0 and 0 <= run["miou"] <= 100
    assert set(run["per_class_iou"]) >= {"sky", "animal"}
    assert run["miou"] != runs["vit_tiny_patch16_224"]["miou"]  # different weights, different score
    assert "# Hummingbird evaluation" in (out / "report.md").read_text()
    from locatdino.common.output_folder import RECORD_NAME, OutputFolder

    written = sorted(
        str(p.relative_to(out))
        for p in out.rglob("*")
        if p.is_file() and p.name not in (RECORD_NAME, ".locatdino.lock")
    )
    assert sorted(OutputFolder(out, "hbird").earlier()) == written and written == [
        "report.md",
        "results.json",
        "vit_tiny_patch16_224-dino_vitt/per_image_confusion.npz",
        "vit_tiny_patch16_224/per_image_confusion.npz",
    ]

    interval = r"\| ([+-]\d+\.\d\d) \[([+-]\d+\.\d\d), ([+-]\d+\.\d\d)\] \|"
    delta, low, high = map(float, re.search(interval, table).groups())
    assert cli.main(["report", str(out), "--summary", str(tmp_path / "cmp.md")]) == 0
    reported = capsys.readouterr().out
    assert "| vit_tiny_patch16_224 |" in reported
    # read in the file's order: the same pair, hence the same interval
    assert list(map(float, re.search(interval, reported).groups())) == [delta, low, high]
    assert "| class |" in (tmp_path / "cmp.md").read_text()


def test_random_init_is_drawn_from_the_seed(tmp_path, capsys):
    """``--checkpoint none`` scores the weights ``torch.manual_seed(--seed)`` draws, every run."""
    from locatdino.models import create_backbone

    torch.manual_seed(3)
    ckpt = tmp_path / "seed3.pth"
    torch.save(create_backbone("vit_tiny_patch16_224").state_dict(), ckpt)
    torch.manual_seed(0)  # the global state before the run must not matter
    argv = [
        "--model",
        "vit_tiny_patch16_224:none",
        "--model",
        f"vit_tiny_patch16_224:{ckpt}",
        "--seed",
        "3",
        "--out",
        str(tmp_path / "out"),
        *TINY,
        "--pos-embed",
        "timm",
    ]  # a plain ViT file would get the DINO rule under 'auto'
    assert cli.main(argv) == 0
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["models"]
    assert len(runs) == 2 and runs[0]["miou"] == runs[1]["miou"]
    # the same weights on the same queries: Δ 0 with the interval [0, 0] (paired per-image matrices)
    assert "| +0.00 [+0.00, +0.00] |" in capsys.readouterr().out


def test_argument_errors(tmp_path):
    with pytest.raises(SystemExit, match="needs a data directory"):
        cli.main(["--model", "vit_tiny_patch16_224", "--dataset", "voc"])


def test_device_and_knn_backend_flags(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert encoder_device("auto", "hbird") == torch.device("cpu")
    with pytest.raises(SystemExit, match="^locatdino hbird: --device cuda:1 but torch sees no CUDA GPU$"):
        encoder_device("cuda:1", "hbird")
    with pytest.raises(SystemExit, match="invalid --device 'gpu'"):
        encoder_device("gpu", "hbird")
    args = cli._parser().parse_args(["--model", "m", "--knn-backend", "torch"])
    assert config_from_args(args, HBIRD_TABLE).knn_backend == "torch"


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fails the test if any model's evaluation starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("an evaluation started before every model was checked")

    monkeypatch.setattr(cli, "hummingbird", refuse)


def _one_error_line(capsys, argv: list[str]) -> str:
    """``locatdino hbird ARGV`` through the dispatcher: exit status 1 and a single stderr line."""
    from locatdino import cli as command_line

    assert command_line.main(["hbird", *argv]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err and captured.err.count("\n") == 1, captured.err
    return captured.err.rstrip("\n")


@pytest.mark.parametrize("bad", ["text", "wider"])
def test_a_bad_second_checkpoint_stops_before_the_first_model_runs(tmp_path, capsys, no_evaluation, bad):
    ckpt = tmp_path / "second.pth"
    if bad == "text":
        ckpt.write_text("placeholder: weights go here\n")
        expected = f"locatdino hbird: {ckpt}: is a text file, not a torch checkpoint (it starts with 'placeholder"
    else:
        wide = timm.create_model("vit_tiny_patch16_224", num_classes=0, depth=2, embed_dim=96, num_heads=2)
        torch.save(wide.state_dict(), ckpt)
        expected = (
            f"locatdino hbird: {ckpt} does not fit vit_tiny_patch16_224: cls_token: checkpoint [1, 1, 96] "
            "vs model [1, 1, 192]; "
        )
    out = tmp_path / "out"
    err = _one_error_line(
        capsys,
        ["--model", "vit_tiny_patch16_224:none", "--model", f"vit_tiny_patch16_224:{ckpt}", "--out", str(out), *TINY],
    )
    assert err.startswith(expected), err
    assert not out.exists()


def test_input_size_pretrained_tag_and_unknown_model_are_one_line(tmp_path, capsys, no_evaluation):
    base = ["--out", str(tmp_path / "out"), *TINY]
    err = _one_error_line(capsys, ["--model", "vit_tiny_patch16_224", *base, "--input-size", "60"])
    assert err == (
        "locatdino hbird: --input-size 60 is not a multiple of the patch size 16 of vit_tiny_patch16_224: use 48 or 64"
    )
    err = _one_error_line(capsys, ["--model", "vit_small_patch16_224.dino:none", *base])
    assert err.startswith(
        "locatdino hbird: vit_small_patch16_224.dino names timm's pretrained weights 'dino', "
        "which locatdino never downloads: pass the weights file (dino_deitsmall16_pretrain.pth)"
    )
    err = _one_error_line(capsys, ["--model", "vit_tiny_patch16_224", "--model", "vit_smal_patch16_224", *base])
    assert err.startswith("locatdino hbird: unknown model 'vit_smal_patch16_224' (did you mean vit_small_patch16_224")


def test_pos_embed_rule_per_model_is_recorded(tmp_path, capsys):
    torch.manual_seed(0)
    ckpt = tmp_path / "dino_vitt.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), ckpt)
    small = [
        "--num-train",
        "2",
        "--num-val",
        "1",
        "--scene-size",
        "32",
        "--input-size",
        "32",
        "--workers",
        "0",
        "--no-progress",
        "--k",
        "2",
    ]
    argv = [
        "--model",
        f"vit_tiny_patch16_224:{ckpt}",
        "--model",
        f"vit_tiny_patch16_224:{ckpt}",
        "--pos-embed",
        "auto",
        "--pos-embed",
        "timm",
        "--out",
        str(tmp_path / "out"),
        *small,
    ]
    assert cli.main(argv) == 0
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["models"]
    assert {r["model"]["label"]: r["model"]["pos_embed"] for r in runs} == {
        "vit_tiny_patch16_224-dino_vitt": "dino",
        "vit_tiny_patch16_224-dino_vitt-2": "timm",
    }
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--pos-embed", "dino"])
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "locatdino hbird: 2 --model but 3 --pos-embed (give one for all models or one per model)\n"
    )


@pytest.mark.parametrize("flag", ["--out", "--memory-dir"])
def test_unwritable_output_fails_before_any_work(tmp_path, capsys, no_evaluation, flag):
    """The results come last: a folder that cannot be written is refused before an evaluation starts."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = {"--out": str(tmp_path / "out"), flag: str(blocker / "sub" / "x")}
    with pytest.raises(SystemExit) as done:
        cli.main(["--model", "vit_tiny_patch16_224", *[a for kv in args.items() for a in kv], *TINY])
    if flag == "--out":  # a refused run creates no output folder: its place is checked instead
        assert (
            str(done.value) == f"locatdino hbird: --out {blocker / 'sub' / 'x'} cannot be created: {blocker} is a file"
        )
    else:
        assert str(done.value).startswith(f"locatdino hbird: {flag} {blocker / 'sub'}")
        assert "is not writable: Not a directory" in str(done.value) and "\n" not in str(done.value)
    assert "[hbird]" not in capsys.readouterr().err


@pytest.mark.slow
def test_memory_dir_on_a_full_disk_fails_in_one_line_before_encoding(tmp_path):
    """A bank larger than the disk: one line, exit 1, no staging folder (it used to die of SIGBUS)."""
    from tests.tiny_disk import python, run_on_tiny_disk

    disk = tmp_path / "disk"
    hbird = python(
        "-m",
        "locatdino",
        "hbird",
        "--model",
        "vit_tiny_patch16_224:none",
        "--memory-dir",
        str(disk / "bank"),
        "--out",
        str(tmp_path / "out"),
        *TINY,
    )
    proc = run_on_tiny_disk(
        disk, "64k", ["sh", "-c", '"$@"; rc=$?; echo "left: $(ls -A "$0")"; exit $rc', str(disk), *hbird]
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("left:")  # nothing: no staging folder
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and err[-1].startswith(f"locatdino hbird: {disk}/.bank.")
    assert "features.bin: No space left on device: needs " in err[-1]
    assert not (tmp_path / "out" / "results.json").exists()


def test_reference_settings_and_provenance_reach_results_json(tmp_path):
    import hashlib
    import os
    from datetime import datetime, timedelta

    torch.manual_seed(0)
    ckpt = tmp_path / "w.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict(), ckpt)
    out = tmp_path / "out"
    start = datetime.now(UTC).replace(microsecond=0)
    argv = [
        "--model",
        f"vit_tiny_patch16_224:{ckpt}",
        "--protocol",
        "reference",
        "--augment",
        "off",
        "--hungarian",
        "pixels",
        "--out",
        str(out),
        *TINY,
    ]
    assert cli.main(argv) == 0
    (run,) = valid_results(out / "results.json", "hbird")["models"]
    # the reference protocol's settings, but for the options given beside it
    assert {k: run["config"][k] for k in ("augment", "norm", "hungarian", "eval_resolution", "precision", "index")} == {
        "augment": "off",
        "norm": True,
        "hungarian": "pixels",
        "eval_resolution": "input",
        "precision": "fp32",
        "index": "Flat",
    }
    assert run["config"]["protocol"] == {
        "name": "reference",
        "changed": ["augment", "hungarian"],
        "settings": {
            "augment": "off",
            "norm": True,
            "eval_resolution": "input",
            "hungarian": "pixels",
            "precision": "fp32",
            "index": "Flat",
        },
    }
    assert run["memory_patches"] == 6 * 16  # whole 64 px images: every patch of every image
    prov = run["provenance"]
    assert prov["checkpoint"] == {
        "path": str(ckpt),
        "bytes": ckpt.stat().st_size,
        "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
    }
    assert start <= datetime.fromisoformat(prov["timestamp"]) <= datetime.now(UTC) + timedelta(seconds=1)
    assert prov["software"]["torch"] == torch.__version__.split("+")[0] and prov["software"]["timm"] == timm.__version__
    assert prov["cpu"]["logical_cores"] == os.cpu_count() and prov["cpu"]["model"]
    assert prov["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "- cpu: " in (out / "report.md").read_text()
    assert cli._parser().parse_args(["--model", "m"]).norm is False  # the project's default: no final norm


def test_augmentation_off_with_several_epochs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="augment 'off' makes all 2 augmentation epochs identical"):
        cli.main(
            [
                "--model",
                "vit_tiny_patch16_224",
                "--augment",
                "off",
                "--aug-epochs",
                "2",
                "--out",
                str(tmp_path / "o"),
                *TINY,
            ]
        )
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "option, value, problem",
    [
        ("--num-train", "0", "must be at least 1, got 0"),
        ("--num-val", "0", "must be at least 1, got 0"),
        ("--input-size", "0", "must be at least 1, got 0"),
        ("--input-size", "-64", "must be at least 1, got -64"),
        ("--k", "0", "must be at least 1, got 0"),
        ("--memory-size", "-1", "must be at least 1, got -1"),
        ("--beta", "0", "must be a positive number, got 0"),
        ("--scale", "nan", "must be a positive number, got nan"),
        ("--workers", "-1", "must be at least 0, got -1"),
        ("--num-val", "x", "expected an integer, got 'x'"),
    ],
)
def test_out_of_range_options_are_one_usage_line_before_any_work(
    tmp_path, capsys, no_evaluation, option, value, problem
):
    """``--num-train 0`` once scored the default 300 scenes and ``--input-size 0`` failed in a
    DataLoader worker: each is now a usage error (exit status 2) naming the option."""
    argv = ["--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "out"), *TINY, option, value]
    if option == "--scale":
        argv.append("1")
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err == (
        f"locatdino hbird: argument {option}: {problem} (locatdino hbird --help lists the options)\n"
    )
    assert not (tmp_path / "out").exists()


def test_open_split_refuses_zero_images():
    from locatdino.evaluation.splits import open_split

    with pytest.raises(ValueError, match="number of val images must be at least 1, got 0"):
        open_split("scenes", None, "val", 0)
    assert len(open_split("scenes", None, "val", None, scene_size=16, default_scenes=3)) == 3


@pytest.mark.parametrize("kind", ["user-folder", "file", "out"])
def test_memory_dir_holding_user_files_is_refused_before_any_work(tmp_path, capsys, no_evaluation, kind):
    """A bank replaces its folder whole: a folder of the user's files, a file, or --out itself
    is refused in one line before anything is evaluated, and left as it was."""
    out = tmp_path / "out"
    target = {"user-folder": tmp_path / "mine", "file": tmp_path / "notes.txt", "out": out}[kind]
    if kind == "file":
        target.write_text("my notes")
    else:
        target.mkdir()
        (target / "thesis.tex").write_text("my notes")
    with pytest.raises(SystemExit) as done:
        cli.main(["--model", "vit_tiny_patch16_224", "--memory-dir", str(target), "--out", str(out), *TINY])
    assert str(done.value).startswith(f"locatdino hbird: memory-bank folder {target} ")
    assert ("is a file" if kind == "file" else "holds files that are not a memory bank (thesis.tex)") in str(done.value)
    assert (target if kind == "file" else target / "thesis.tex").read_text() == "my notes"
    assert "[hbird]" not in capsys.readouterr().err


def test_memory_dir_may_not_be_the_out_folder(tmp_path, no_evaluation):
    with pytest.raises(SystemExit, match=f"--memory-dir {tmp_path / 'out'} would replace --out {tmp_path / 'out'}"):
        cli.main(
            [
                "--model",
                "vit_tiny_patch16_224",
                "--memory-dir",
                str(tmp_path / "out"),
                "--out",
                str(tmp_path / "out"),
                *TINY,
            ]
        )


@pytest.mark.parametrize("name", ["results.json", "report.md"])
def test_out_holding_other_files_of_those_names_is_refused(tmp_path, no_evaluation, name):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / name).write_text("# Hummingbird: my notes")  # its shape does not make it hbird's
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(
            SystemExit,
            match=f"--out {tmp_path / 'out'} holds {name}, which locatdino hbird did not "
            "write: move it or choose another --out",
        ):
            cli.main(["--model", "vit_tiny_patch16_224", "--out", str(tmp_path / "out"), *TINY, *overwrite])
    assert (tmp_path / "out" / name).read_text() == "# Hummingbird: my notes"


@pytest.fixture
def scored(monkeypatch):
    """hbird's evaluation replaced by a fixed score per call (40, 41, ...): the command's files only."""
    from locatdino.evaluation.hbird.evaluate import HummingbirdResult

    calls = []

    def fake(model, train_set, val_set, cfg, shared=False):
        calls.append(cfg)
        result = {name: None for name in HummingbirdResult.__dataclass_fields__}
        result.update(
            miou=40.0 + len(calls),
            miou_matched=40.0,
            pixel_accuracy=80.0,
            per_class_iou={"a": 50.0},
            memory_patches=10,
            num_train=6,
            num_val=2,
            skipped=0,
            timings={},
            config={},
            provenance={},
        )
        return HummingbirdResult(**result)

    monkeypatch.setattr(cli, "hummingbird", fake)
    return calls


def test_a_second_run_into_a_finished_out_needs_overwrite_which_leaves_nothing_stale(tmp_path, capsys, scored):
    """A second hbird replaced the first's results.json unasked; and a one-model run's results.json
    stayed beside a two-model run's folders, read by ``hbird report`` as a third row."""
    out = tmp_path / "out"
    one = ["--model", "vit_tiny_patch16_224", "--out", str(out), *TINY]
    assert cli.main(one) == 0
    first = (out / "results.json").read_text()
    with pytest.raises(
        SystemExit,
        match=f"^locatdino hbird: --out {out} holds the output of an earlier run "
        r"\(results.json and 1 more\): pass --overwrite to replace it, or choose "
        "another --out$",
    ):
        cli.main(one)
    assert (out / "results.json").read_text() == first and len(scored) == 1  # refused before any evaluation
    two = ["--model", "a=vit_tiny_patch16_224", "--model", "b=vit_tiny_patch16_224", "--out", str(out), *TINY]
    assert cli.main([*two, "--overwrite"]) == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.json")) == [".locatdino-output.json", "results.json"]
    capsys.readouterr()
    assert cli.main(["report", str(out)]) == 0
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| a ") or line.startswith("| b ") or line.startswith("| . ") or line.startswith("| out ")
    ]
    assert [row.split("|")[1].strip() for row in rows] == ["a", "b"]


def test_a_second_run_into_one_out_is_refused_while_the_first_runs(tmp_path, capsys, no_evaluation):
    """Two runs into one --out used to both say 'results written', one result lost: the second
    is refused at once, naming the first's lock."""
    import os

    from locatdino.common.output_files import output_lock

    out = tmp_path / "out"
    with output_lock(out, "--out"):  # the first run, still evaluating
        err = _one_error_line(capsys, ["--model", "vit_tiny_patch16_224", "--out", str(out), *TINY])
    assert err == (
        f"locatdino hbird: --out {out} is in use by another run (pid {os.getpid()} on "
        f"{err.split(' on ')[1].split(';')[0]}; lock {out / '.locatdino.lock'}): wait for it to end or "
        "choose another folder"
    )


def test_a_checkpoint_with_non_finite_weights_is_refused_before_any_work(tmp_path, capsys, no_evaluation):
    """Right shapes, NaN/inf weights (a diverged run): once scored an mIoU, now one line naming it."""
    state = timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict()
    state["norm.weight"][5] = float("inf")
    ckpt = tmp_path / "diverged.pth"
    torch.save(state, ckpt)
    err = _one_error_line(capsys, ["--model", f"vit_tiny_patch16_224:{ckpt}", "--out", str(tmp_path / "out"), *TINY])
    assert err == (
        f"locatdino hbird: {ckpt}: 1 NaN/inf weight value(s) in norm.weight (a diverged run? use a "
        "checkpoint from before it)"
    )


def test_overflowing_features_stop_the_run_in_one_line(tmp_path, capsys):
    """Finite but huge weights (x1e30) gave inf/NaN features, scored as an ordinary mIoU (4.16), rc 0."""
    state = {
        k: v * 1e30 if v.is_floating_point() else v
        for k, v in timm.create_model("vit_tiny_patch16_224", num_classes=0).state_dict().items()
    }
    ckpt = tmp_path / "huge.pth"
    torch.save(state, ckpt)
    from locatdino import cli as command_line

    assert (
        command_line.main(
            [
                "hbird",
                "--model",
                f"vit_tiny_patch16_224:{ckpt}",
                "--out",
                str(tmp_path / "out"),
                *TINY,
                "--precision",
                "fp32",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1] == (
        "locatdino hbird: the encoder's patch features (block -1) are not finite in fp32: its weights "
        "overflow (a diverged run, or a checkpoint with huge values?); nothing was scored"
    )
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_memory_smaller_than_k_is_refused_before_the_memory_pass(tmp_path, no_evaluation):
    with pytest.raises(SystemExit) as refused:
        cli.main(
            [
                "--model",
                "vit_tiny_patch16_224",
                "--out",
                str(tmp_path / "out"),
                *TINY,
                "--memory-size",
                "8",
                "--k",
                "30",
            ]
        )
    assert str(refused.value) == (
        "locatdino hbird: memory_size (--memory-size) 8 keeps fewer patches than k (--k) 30 "
        "neighbours per query: give at least 30"
    )
    assert not (tmp_path / "out").exists()
