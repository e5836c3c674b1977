"""A new run from ``model.backbone_checkpoint``: a full DINO training checkpoint gives both networks,
heads and the loss centre; a backbone release the backbones, with fresh heads; one line says which."""

import pytest
import torch
from ssl_helpers import TINY_MODEL, tiny_module, tiny_overrides

from locatdino.models import locatify
from locatdino.ssl.objective.start_weights import start_line
from locatdino.ssl.run import cli


def dino_layout(branch: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """A branch's state dict as facebookresearch/dino saves it: weight norm as ``weight_g`` /
    ``weight_v`` (torch.nn.utils.weight_norm), ``prefix`` (``module.`` for the DDP student)."""
    names = {"parametrizations.weight.original0": "weight_g", "parametrizations.weight.original1": "weight_v"}
    out = {}
    for key, value in branch.state_dict().items():
        for new, old in names.items():
            key = key.replace(new, old)
        out[prefix + key] = value.clone()
    return out


@pytest.fixture
def trained():
    """A tiny DINO module whose every tensor is random (as after training), and its centre."""
    torch.manual_seed(0)
    module = tiny_module()
    for p in module.parameters():
        p.data.normal_(0, 0.1)
    return module, torch.randn(1, TINY_MODEL["out_dim"])


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_full_dino_checkpoint_gives_both_networks_heads_and_the_centre(trained, tmp_path):
    module, center = trained
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {
            "student": dino_layout(module.student, "module."),
            "teacher": dino_layout(module.teacher, ""),
            "dino_loss": {"center": center},
            "epoch": 12,
            "optimizer": {},
        },
        path,
    )
    torch.manual_seed(1)
    started = tiny_module(backbone_checkpoint=str(path))
    assert _same(started.student, module.student) and _same(started.teacher, module.teacher)
    assert not _same(started.student, started.teacher)
    assert torch.equal(started.dino_loss.center, center[0])
    assert start_line(started, started._start_weights) == (
        f"model.backbone_checkpoint {path} (a DINO training checkpoint): took the backbone and head of the student "
        "and the teacher, the dino_loss centre; initialised nothing"
    )


def test_a_backbone_release_starts_both_networks_with_fresh_heads(trained, tmp_path):
    module, _ = trained
    path = tmp_path / "release.pth"
    backbone = module.teacher["backbone"]
    torch.save(backbone.state_dict(), path)
    started = tiny_module(backbone_checkpoint=str(path))
    assert _same(started.student["backbone"], backbone) and _same(started.teacher["backbone"], backbone)
    assert _same(started.student["head"], started.teacher["head"])
    head = started.student["head"]  # DINOHead's init: gains 1, biases 0
    assert torch.equal(head.last_layer.parametrizations.weight.original0, torch.ones(TINY_MODEL["out_dim"], 1))
    assert all(not m.bias.any() for m in head.mlp if isinstance(m, torch.nn.Linear))
    assert not started.dino_loss.center.any()
    assert start_line(started, started._start_weights) == (
        f"model.backbone_checkpoint {path} (a backbone): took the backbone for the student and the teacher; "
        "initialised the heads, the dino_loss centre"
    )


def test_ibot_from_a_dino_checkpoint_initialises_what_dino_has_not(trained, tmp_path):
    from locatdino.ssl import IBOTModule

    module, center = trained
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {
            "student": dino_layout(module.student, "module."),
            "teacher": dino_layout(module.teacher, ""),
            "dino_loss": {"center": center},
        },
        path,
    )
    ibot = IBOTModule(**TINY_MODEL, backbone="vit_tiny_patch16_224", batch_size=4, backbone_checkpoint=str(path))
    assert _same(ibot.teacher["head"], module.teacher["head"]) and torch.equal(ibot.dino_loss.center, center[0])
    assert start_line(ibot, ibot._start_weights) == (
        f"model.backbone_checkpoint {path} (a DINO training checkpoint): took the backbone and head of the student "
        "and the teacher, the dino_loss centre; initialised the patch_heads, the ibot_loss centre, the mask_token"
    )


def test_a_head_of_another_shape_is_refused_in_one_line(trained, tmp_path):
    module, center = trained
    path = tmp_path / "checkpoint.pth"
    torch.save(
        {
            "student": dino_layout(module.student, "module."),
            "teacher": dino_layout(module.teacher, ""),
            "dino_loss": {"center": center},
        },
        path,
    )
    with pytest.raises(ValueError) as err:
        tiny_module(backbone_checkpoint=str(path), out_dim=64)
    assert str(err.value).startswith(
        f"{path}: the student's head does not fit the run's (last_layer.parametrizations."
        "weight.original0: checkpoint [128, 1] vs model [64, 1]"
    )
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_fit_continues_from_a_locatified_release_and_says_what_it_took(tmp_path, capsys):
    """The tiny recipe, 2 steps, from a LocAtViT made by ``locatify`` of a vanilla release."""
    from locatdino.models import create_backbone

    torch.manual_seed(0)
    release = locatify(create_backbone("vit_tiny_patch16_224", **TINY_MODEL["backbone_kwargs"]))
    path = tmp_path / "locat_release.pth"
    torch.save(release.state_dict(), path)
    args = [
        *tiny_overrides(tmp_path),
        "--model.backbone",
        "locatvit_tiny_patch16_224",
        "--model.backbone_checkpoint",
        str(path),
        "--trainer.max_steps",
        "2",
    ]
    assert cli.main(args) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "backbone_checkpoint" in line]
    assert lines == [
        f"locatdino fit: model.backbone_checkpoint {path} (a backbone): took the backbone for the student "
        "and the teacher; initialised the heads, the dino_loss centre"
    ]
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    # two EMA steps (momentum 0.99, lr warming up from 0) from the release: the teacher is still it,
    # where another init would differ by about the weights' scale (0.02)
    drift = max((state[f"teacher.backbone.{k}"] - v).abs().max().item() for k, v in release.state_dict().items())
    assert drift < 1e-3
