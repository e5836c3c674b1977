"""``fit --model.backbone locatvit_*_dinov3 --model.backbone_checkpoint RELEASE``: a DINOv3 release (Meta's
hub layout, or timm's keys) continues as its LocAt version. Every vanilla weight is the release's, GAug
keeps its initialisation, and one line says which is which (tiny random releases written here)."""

import json

import pytest
import timm
import torch
from ssl_helpers import TINY_IBOT, tiny_overrides

from locatdino.models import create_backbone
from locatdino.ssl import DINOModule
from locatdino.ssl.objective.start_weights import start_line
from locatdino.ssl.run import cli
from tests.models.checkpoints.dinov3_reference import release_weights

GEOMETRY = dict(embed_dim=32, depth=2, num_heads=2)
HEAD = dict(out_dim=16, hidden_dim=16, bottleneck_dim=8)


@pytest.fixture(params=["hub", "timm"])
def release(request, tmp_path):
    """``(path, the vanilla timm name)`` of a DINOv3 ViT-S/16 release in Meta's layout or in timm's keys."""
    if request.param == "hub":  # q / v biases: the _qkvb name
        torch.save(release_weights(32, 2, 2, seed=3), tmp_path / "dinov3_vits16_pretrain_lvd1689m.pth")
        return tmp_path / "dinov3_vits16_pretrain_lvd1689m.pth", "vit_small_patch16_dinov3_qkvb"
    torch.manual_seed(3)
    made = timm.create_model("vit_small_patch16_dinov3", num_classes=0, **GEOMETRY)
    torch.save(made.state_dict(), tmp_path / "vit_small_patch16_dinov3.pth")
    return tmp_path / "vit_small_patch16_dinov3.pth", "vit_small_patch16_dinov3"


def test_a_dinov3_release_continues_as_its_locat_version(release):
    path, vanilla = release
    reference = create_backbone(vanilla, path, **GEOMETRY).state_dict()
    torch.manual_seed(0)
    module = DINOModule(backbone=f"locat{vanilla}", backbone_kwargs=GEOMETRY, backbone_checkpoint=str(path), **HEAD)
    gaug = 2 * 2 * 2  # log_var and log_alpha, weight and bias, per block
    for branch in (module.student, module.teacher):
        state = branch["backbone"].state_dict()
        assert sorted(k for k in state if k not in reference) == sorted(k for k in state if ".attn.gaug." in k)
        assert len(set(state) - set(reference)) == gaug
        for key, value in reference.items():  # every vanilla weight taken as it is
            torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
        for key in set(state) - set(reference):  # GAug at its init: zero biases, weights of std 0.02
            value = state[key]
            assert (value == 0).all() if key.endswith("bias") else 0 < value.std() < 0.05, key
    student, teacher = module.student["backbone"].state_dict(), module.teacher["backbone"].state_dict()
    assert all(torch.equal(student[k], teacher[k]) for k in student)
    assert start_line(module, module._start_weights) == (
        f"model.backbone_checkpoint {path} (a backbone): took the backbone (every weight but GAug's) for the "
        f"student and the teacher; initialised GAug's {gaug} tensors (new in the LocAt version), the heads, the "
        "dino_loss centre"
    )


def test_a_locat_file_takes_its_gaug_too(tmp_path):
    """A LocAt file gives GAug as well: the line says nothing is new in the backbone."""
    torch.manual_seed(1)
    made = create_backbone("locatvit_small_patch16_dinov3", **GEOMETRY)
    torch.save(made.state_dict(), tmp_path / "locat.pth")
    module = DINOModule(
        backbone="locatvit_small_patch16_dinov3",
        backbone_kwargs=GEOMETRY,
        backbone_checkpoint=str(tmp_path / "locat.pth"),
        **HEAD,
    )
    state = module.student["backbone"].state_dict()
    assert all(torch.equal(state[k], v) for k, v in made.state_dict().items())
    assert start_line(module, module._start_weights).endswith(
        "for the student and the teacher; initialised the heads, the dino_loss centre"
    )


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["dino", "ibot"])
@pytest.mark.parametrize("backbone", ["vit_small_patch16_dinov3", "locatvit_tiny_rope_mixed"])
def test_fit_trains_dinov3_and_locat_rope_backbones_for_two_steps(tmp_path, objective, backbone):
    """``locatdino fit`` (the tiny recipes) with DINOv3's architecture and a LocAt RoPE ViT, 2 steps."""
    args = tiny_overrides(tmp_path)
    args[args.index("--model.backbone_kwargs") + 1] = json.dumps(TINY_IBOT["backbone_kwargs"])  # 4 × 4 tokens
    if objective == "ibot":
        args[args.index("--config") + 1] = args[args.index("--config") + 1].replace("dino_tiny", "ibot_tiny")
        args += ["--model.patch_out_dim", "96"]
    assert cli.main([*args, "--model.backbone", backbone, "--trainer.max_steps", "2"]) == 0
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert ckpt["global_step"] == 2 and ckpt["hyper_parameters"]["backbone"] == backbone
    state = ckpt["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    moved = [k for k in state if k.startswith("student.backbone.") and "blocks.1." in k]
    assert moved and any(not torch.equal(state[k], state[k.replace("student.", "teacher.", 1)]) for k in moved)
