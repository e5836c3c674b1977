"""``export --format safetensors`` and ``--format hf-hub`` load in timm and give the run's own tokens."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors
import timm
import torch
from ssl_helpers import TINY_MODEL

from locatdino import cli as command_line
from locatdino.models import create_backbone
from locatdino.ssl.export import cli as export
from locatdino.ssl.export.files import export_metadata
from locatdino.ssl.export.model_card import model_card


def fit_checkpoint(folder, name: str, step: int = 7, kwargs: dict = TINY_MODEL["backbone_kwargs"]):
    """A ``fit`` checkpoint as LightningCLI saves one (teacher and student of the ``name`` backbone
    built with ``kwargs``, hyper-parameters, step) in ``folder/checkpoints/``, its run's held-out
    scores in ``folder/logs/version_0/metrics.csv``; returns its path and the teacher backbone."""
    torch.manual_seed(0)
    teacher = create_backbone(name, **kwargs).eval()
    for p in teacher.parameters():  # GAug's parameters start at constants: make every tensor count
        p.data.normal_(0, 0.1)
    state = {f"teacher.backbone.{k}": v for k, v in teacher.state_dict().items()}
    state.update({f"student.backbone.{k}": torch.zeros_like(v) for k, v in teacher.state_dict().items()})
    path = folder / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(
        {
            "pytorch-lightning_version": "2.5.0",
            "state_dict": state,
            "global_step": step,
            "epoch": 1,
            "evaluated_network": "teacher",
            "hyper_parameters": {
                "backbone": name,
                "backbone_kwargs": kwargs,
                "out_dim": 128,
                "_class_path": "locatdino.ssl.DINOModule",
            },
        },
        path,
    )
    (folder / "logs" / "version_0").mkdir(parents=True)
    (folder / "logs" / "version_0" / "metrics.csv").write_text(
        "epoch,step,hbird/mIoU,train/loss\n0,3,21.5,\n0,5,,4.2\n1,6,30.25,\n1,9,44.0,\n"
    )
    return path, teacher


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


ARCHITECTURES = {
    "vit_tiny_patch16_224": "vit_tiny_patch16_224",
    "locatvit_tiny_patch16_224": "locatvit_tiny_patch16_224",
}
IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "locatvit_tiny_patch16_224"])
def test_safetensors_and_hf_hub_exports_give_the_run_s_tokens_in_timm(tmp_path, name, capsys):
    ckpt, teacher = fit_checkpoint(tmp_path / "run", name)
    tokens = teacher.forward_features(IMAGES)
    out, hub = tmp_path / "teacher.safetensors", tmp_path / "hub"
    assert export.main([str(ckpt), str(out)]) == 0  # the format from the name
    assert export.main([str(ckpt), str(hub), "--format", "hf-hub"]) == 0, capsys.readouterr().err

    config = json.loads((tmp_path / "teacher.config.json").read_text())
    arch = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=str(out)), **config["model_args"]
    ).eval()
    local = timm.create_model(f"local-dir:{hub}", pretrained=True).eval()
    for model in (arch, local):
        assert model.num_classes == 0 and torch.equal(model.forward_features(IMAGES), tokens)

    with safetensors.safe_open(out, framework="pt") as f:
        header = f.metadata()
    assert {k: header[k] for k in ("model", "img_size", "patch_size", "objective", "network", "step")} == {
        "model": ARCHITECTURES[name],
        "img_size": "32",
        "patch_size": "16",
        "objective": "locatdino.ssl.DINOModule",
        "network": "teacher",
        "step": "7",
    }
    assert config["model_args"]["img_size"] == [32, 32] and config["pretrained_cfg"]["input_size"] == [3, 32, 32]
    written = {k: v for k, v in header.items() if k != "format"}  # safetensors' own key
    assert export_metadata(hub / "config.json") == export_metadata(hub / "model.safetensors") == written
    assert written["source"] == "last.ckpt"  # never a local path: the files are pushed and shared
    assert export_metadata(hub / "README.md") == written
    for path in (out, tmp_path / "teacher.config.json", *hub.iterdir()):
        assert str(tmp_path).encode() not in path.read_bytes(), path
    card = (hub / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: timm\n")
    assert "step 7, epoch 1" in card and "out_dim: 128" in card
    assert "| hbird/mIoU | 30.25 | 6 |" in card  # the last score up to the checkpoint's step, not step 9's


def test_a_run_recorded_under_an_earlier_model_name_still_exports_and_loads(tmp_path):
    """A run whose checkpoint recorded ``locatvit_tiny`` (now a timm deprecation of
    ``locatvit_tiny_patch16_224``): exported under the current name, and loaded by the old name."""
    deprecated = "Mapping deprecated model name locatvit_tiny to current locatvit_tiny_patch16_224"
    with pytest.warns(UserWarning, match=deprecated):
        ckpt, teacher = fit_checkpoint(tmp_path / "run", "locatvit_tiny")
    assert torch.load(ckpt, weights_only=False)["hyper_parameters"]["backbone"] == "locatvit_tiny"
    out = tmp_path / "teacher.safetensors"
    with pytest.warns(UserWarning, match=deprecated):
        assert export.main([str(ckpt), str(out)]) == 0
    config = json.loads((tmp_path / "teacher.config.json").read_text())
    assert config["architecture"] == "locatvit_tiny_patch16_224"
    exported = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=str(out)), **config["model_args"]
    ).eval()
    with pytest.warns(UserWarning, match=deprecated):
        by_old_name = create_backbone("locatvit_tiny", str(ckpt), **TINY_MODEL["backbone_kwargs"]).eval()
    tokens = teacher.forward_features(IMAGES)
    assert all(torch.equal(m.forward_features(IMAGES), tokens) for m in (exported, by_old_name))


@pytest.mark.slow
def test_a_vanilla_export_loads_in_timm_without_this_package(tmp_path):
    ckpt, teacher = fit_checkpoint(tmp_path / "run", "vit_tiny_patch16_224")
    out = tmp_path / "teacher.safetensors"
    assert export.main([str(ckpt), str(out)]) == 0
    export.main([str(ckpt), str(tmp_path / "hub"), "--format", "hf-hub"])
    tokens = teacher.forward_features(IMAGES).detach()
    torch.save(tokens, tmp_path / "tokens.pt")
    script = (
        "import json, sys, timm, torch\n"
        "d = sys.argv[1]\n"
        "cfg = json.load(open(d + '/teacher.config.json'))\n"
        "a = timm.create_model(cfg['architecture'], pretrained=True,"
        " pretrained_cfg_overlay=dict(file=d + '/teacher.safetensors'), **cfg['model_args']).eval()\n"
        "b = timm.create_model('local-dir:' + d + '/hub', pretrained=True).eval()\n"
        "x, tokens = torch.load(d + '/images.pt'), torch.load(d + '/tokens.pt')\n"
        "weights = torch.load(d + '/weights.pt')\n"
        "assert not [m for m in sys.modules if m.startswith('locatdino')]\n"
        "same = all(torch.equal(v, m.state_dict()[k]) for m in (a, b) for k, v in weights.items())\n"
        "gap = max(float((m.forward_features(x) - tokens).abs().max()) for m in (a, b))\n"
        "print(same, gap)\n"
    )
    torch.save(IMAGES, tmp_path / "images.pt")
    torch.save(teacher.state_dict(), tmp_path / "weights.pt")
    # the child's own thread settings, not whatever this process's environment holds
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    same, gap = proc.stdout.split()
    assert same == "True"  # the weights timm loaded are the teacher's, bit for bit (saved and read back)
    # the tokens of another process: fp32 GEMMs may reduce in another order there (thread count, CPU kernels)
    assert float(gap) < 1e-4 * float(tokens.abs().max())


def test_a_hub_folder_keeps_other_files_and_is_replaced_only_with_overwrite(tmp_path, capsys):
    ckpt, _ = fit_checkpoint(tmp_path / "run", "vit_tiny_patch16_224")
    hub = tmp_path / "hub"
    (hub / ".git").mkdir(parents=True)  # a clone of the user's Hub repo
    (hub / "notes.txt").write_text("mine")
    args = [str(ckpt), str(hub), "--format", "hf-hub"]
    assert export.main(args) == 0
    assert export.main(args) == 1
    assert _one_line(capsys) == (
        f"locatdino export: the output {hub / 'model.safetensors'} is an earlier export (the "
        "vit_tiny_patch16_224 teacher of last.ckpt, step 7): pass --overwrite to replace it, "
        "or choose another folder"
    )
    assert export.main([*args, "--which", "student", "--overwrite"]) == 0
    assert export_metadata(hub / "config.json")["network"] == "student"
    assert export_metadata(hub / "README.md")["network"] == "student"
    assert sorted(p.name for p in hub.iterdir()) == [
        ".git",
        "README.md",
        "config.json",
        "model.safetensors",
        "notes.txt",
    ]
    # the card the user wrote is theirs: never replaced, --overwrite or not, and nothing is written
    weights = (hub / "model.safetensors").read_bytes()
    (hub / "README.md").write_text("# my model\n")
    assert export.main([*args, "--overwrite"]) == 1
    assert _one_line(capsys) == (
        f"locatdino export: the output {hub / 'README.md'} exists and was not written by export, which "
        "never replaces such a file: choose another folder"
    )
    assert (hub / "README.md").read_text() == "# my model\n" and (hub / "model.safetensors").read_bytes() == weights


def test_a_hub_output_that_is_a_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    """A folder named config.json: the weights were written, then a raw ``[Errno 21]``."""
    ckpt, _ = fit_checkpoint(tmp_path / "run", "vit_tiny_patch16_224")
    (tmp_path / "hub" / "config.json").mkdir(parents=True)
    assert export.main([str(ckpt), str(tmp_path / "hub"), "--format", "hf-hub", "--overwrite"]) == 1
    assert _one_line(capsys) == (
        f"locatdino export: the output {tmp_path / 'hub' / 'config.json'} is a folder, where export writes a "
        "file: choose another folder"
    )
    assert [p.name for p in (tmp_path / "hub").iterdir()] == ["config.json"]


def test_the_model_card_names_files_not_local_paths():
    card = model_card(
        {"model": "vit_tiny_patch16_224", "img_size": "32", "patch_size": "16", "source": "last.ckpt"},
        {
            "backbone": "vit_tiny_patch16_224",
            "backbone_checkpoint": "/home/me/weights/dino.pth",
            "teacher": "vit_large_patch16_dinov3:/home/me/weights/dinov3.pth",
            "crops": ["/a/b"],
        },
        {},
        None,
    )
    assert "/home/me" not in card and "backbone_checkpoint: dino.pth" in card and "- b" in card
    assert "teacher: vit_large_patch16_dinov3:dinov3.pth" in card


REFUSALS = {
    "safetensors format, .pth name": (
        ["{ckpt}", "{tmp}/t.pth", "--format", "safetensors"],
        "the output {tmp}/t.pth: --format safetensors writes a .safetensors file (timm "
        "picks its reader by the suffix): name it {tmp}/t.safetensors",
    ),
    "pth format, .safetensors name": (
        ["{ckpt}", "{tmp}/t.safetensors", "--format", "pth"],
        "the output {tmp}/t.safetensors is named .safetensors but --format pth writes a "
        "torch file: choose another name",
    ),
    "hub onto a file": (
        ["{ckpt}", "{tmp}/file.txt", "--format", "hf-hub"],
        "the output {tmp}/file.txt is a file: --format hf-hub writes a folder, give a folder name",
    ),
    "no model for a plain file": (
        ["{plain}", "{tmp}/t.safetensors"],
        "{plain}: --format safetensors writes the model's config, so name the model the "
        "weights are for: NAME:{plain} (e.g. vit_small_patch16_224:{plain})",
    ),
    "another model than the run's": (
        ["locatvit_tiny_patch16_224:{ckpt}", "{tmp}/t.safetensors"],
        "{ckpt} holds a vit_tiny_patch16_224 backbone, not locatvit_tiny_patch16_224: leave the name "
        "out for a fit checkpoint",
    ),
    "a folder for a file format": (
        ["{ckpt}", "{tmp}/run"],
        "the output {tmp}/run is a folder: give a file name, or --format hf-hub to write a Hub folder",
    ),
    "a sidecar that is not ours": (
        ["{ckpt}", "{tmp}/side.safetensors"],
        "the output {tmp}/side.config.json exists and was not written by export, which never "
        "replaces such a file: choose another file",
    ),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_format_refusals_are_one_line_before_anything_is_written(tmp_path, capsys, case):
    ckpt, teacher = fit_checkpoint(tmp_path / "run", "vit_tiny_patch16_224")
    plain = tmp_path / "plain.pth"
    torch.save(teacher.state_dict(), plain)
    (tmp_path / "file.txt").write_text("mine")
    (tmp_path / "side.config.json").write_text("{}")
    before = sorted(tmp_path.iterdir())
    args, expected = REFUSALS[case]
    values = {"ckpt": ckpt, "tmp": tmp_path, "plain": plain}
    assert export.main([a.format(**values) for a in args]) == 1
    assert _one_line(capsys) == "locatdino export: " + expected.format(**values)
    assert sorted(tmp_path.iterdir()) == before


def test_a_named_release_file_exports_through_the_loader(tmp_path, capsys):
    """``NAME:FILE``: a released backbone (a plain state dict) loaded into NAME by create_backbone."""
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=32).eval()
    release = tmp_path / "dino_release.pth"
    torch.save(vit.state_dict(), release)
    out = tmp_path / "vit.safetensors"
    assert export.main([f"vit_tiny_patch16_224:{release}", str(out)]) == 0, capsys.readouterr().err
    header = export_metadata(out)
    assert header["model"] == "vit_tiny_patch16_224" and header["img_size"] == "32" and "objective" not in header
    assert header["pos_embed_rule"] == "dino"  # the released DINO format's rule, recorded
    config = json.loads(out.with_suffix(".config.json").read_text())
    again = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=dict(file=str(out)), **config["model_args"]
    ).eval()
    assert torch.equal(again.forward_features(IMAGES), vit.forward_features(IMAGES))


def test_the_docs_round_trip_runs_as_written(tmp_path, monkeypatch):
    """docs/checkpoints.md's export commands and Python, run as a user pastes them, on a
    dino_tiny_cpu run (ViT-T/8 at 64 px) made here."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    section = text.split("## Export: files timm loads without this package", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    (python,) = re.findall(r"```python\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    _, teacher = fit_checkpoint(
        tmp_path / "runs" / "dino_tiny_cpu", "vit_tiny_patch16_224", kwargs={"img_size": 64, "patch_size": 8}
    )
    lines = commands.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("locatdino export ") for line in lines)
    for line in lines:
        assert command_line.main(shlex.split(line)[1:]) == 0
    scope: dict = {}
    exec(compile(python, "docs/checkpoints.md", "exec"), scope)
    assert scope["tokens"].shape == (1, 65, 192)
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(scope["model"].forward_features(x), teacher.forward_features(x))
    assert torch.equal(scope["same"].forward_features(x), teacher.forward_features(x))


def test_an_export_keeps_the_position_embedding_rule_it_ran_with(tmp_path):
    """``--pos-embed auto`` reads the rule an export recorded: a ``fit`` run's vanilla ViT keeps
    timm's in every format, where the same weights as a bare state dict (a release's format) get
    the reference DINO rule."""
    ckpt, teacher = fit_checkpoint(tmp_path / "run", "vit_tiny_patch16_224")
    outs = [tmp_path / "teacher.pth", tmp_path / "teacher.safetensors", tmp_path / "hub"]
    for out in outs:
        assert export.main([str(ckpt), str(out), *(["--format", "hf-hub"] if out.name == "hub" else [])]) == 0
    bare = tmp_path / "bare.pth"
    torch.save(dict(teacher.state_dict()), bare)
    kwargs = TINY_MODEL["backbone_kwargs"]
    rules = [create_backbone("vit_tiny_patch16_224", str(path), **kwargs).pos_embed_rule for path in (*outs, bare)]
    assert rules == ["timm", "timm", "timm", "dino"]
    big = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))  # another grid: the rules differ
    exported, released = (create_backbone("vit_tiny_patch16_224", str(p), **kwargs).eval() for p in (outs[1], bare))
    assert torch.equal(exported.forward_features(big), teacher.eval().forward_features(big))
    assert not torch.allclose(released.forward_features(big), exported.forward_features(big))
