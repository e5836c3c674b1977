"""``create_backbone`` reads a file once and builds the model once: the reader returns everything the
build needs (container, weights, patch, trained grid, position-embedding rule), counted here by wrapping
``torch.load``, the safetensors package's ``safe_open`` and ``timm.create_model``."""

import pytest
import safetensors
import safetensors.torch
import timm
import torch
from safetensors.torch import save_file

from locatdino.models import create_backbone
from locatdino.models.checkpoints import safetensors_file
from locatdino.models.checkpoints.contents import EXPORT_KEY, WRITTEN_BY, read_backbone_file
from tests.models.checkpoints.dinov2_reference import release_weights

NARROW = dict(depth=2, embed_dim=64, num_heads=2)  # no img_size: the file's grid decides it


@pytest.fixture
def counts(monkeypatch) -> dict[str, list]:
    """``{"torch.load": [paths], "safe_open": [paths], "builds": [names]}``, filled as they are called."""
    found: dict[str, list] = {"torch.load": [], "safe_open": [], "builds": []}
    load, safe_open, create = torch.load, safetensors.safe_open, timm.create_model

    def counted(key, fn):
        def wrapper(*args, **kwargs):
            found[key].append(str(args[0]))
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(torch, "load", counted("torch.load", load))
    for module in (safetensors_file, safetensors.torch):  # ours, and the package's load_file
        monkeypatch.setattr(module, "safe_open", counted("safe_open", safe_open))
    monkeypatch.setattr(timm, "create_model", counted("builds", create))
    return found


def test_a_locatvit_trained_at_another_patch_and_grid_is_read_once_and_built_once(tmp_path, counts):
    """A patch-8, 64 px LocAtViT under the patch-16, 224 px name: built once at patch 8 and 64 px (a
    default build, then one at the file's patch, then one at its grid, before)."""
    torch.manual_seed(0)
    made = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, patch_size=8, img_size=64, **NARROW)
    torch.save(made.state_dict(), tmp_path / "p8.pth")
    counts["builds"].clear()
    model = create_backbone("locatvit_tiny_patch16_224", tmp_path / "p8.pth", **NARROW)
    assert counts == {
        "torch.load": [str(tmp_path / "p8.pth")],
        "safe_open": [],
        "builds": ["locatvit_tiny_patch16_224"],
    }
    assert tuple(model.patch_embed.patch_size) == (8, 8) and tuple(model.patch_embed.grid_size) == (8, 8)
    assert tuple(model.blocks[0].attn.gaug.build_grid) == (8, 8)
    torch.testing.assert_close(model.pos_embed, made.pos_embed, rtol=0, atol=0)


def test_an_export_in_safetensors_is_opened_once_and_keeps_its_recorded_rule(tmp_path, counts):
    torch.manual_seed(0)
    made = timm.create_model("vit_tiny_patch16_224", num_classes=0, **NARROW)
    metadata = {"written_by": WRITTEN_BY, "pos_embed_rule": "timm"}  # export's header for a fit run's backbone
    save_file(made.state_dict(), tmp_path / "export.safetensors", metadata=metadata)
    counts["builds"].clear()
    model = create_backbone("vit_tiny_patch16_224", tmp_path / "export.safetensors", **NARROW)
    assert counts == {
        "torch.load": [],
        "safe_open": [str(tmp_path / "export.safetensors")],
        "builds": ["vit_tiny_patch16_224"],
    }
    assert model.pos_embed_rule == "timm"  # a plain release file would get DINO's rule
    save_file(made.state_dict(), tmp_path / "release.safetensors")
    assert create_backbone("vit_tiny_patch16_224", tmp_path / "release.safetensors", **NARROW).pos_embed_rule == "dino"


def test_an_export_in_torch_format_keeps_its_recorded_rule_from_the_one_load(tmp_path, counts):
    torch.manual_seed(0)
    state = timm.create_model("vit_tiny_patch16_224", num_classes=0, **NARROW).state_dict()
    state._metadata = {EXPORT_KEY: {"written_by": WRITTEN_BY, "pos_embed_rule": "timm"}}
    torch.save(state, tmp_path / "export.pth")
    counts["builds"].clear()
    assert create_backbone("vit_tiny_patch16_224", tmp_path / "export.pth", **NARROW).pos_embed_rule == "timm"
    assert (len(counts["torch.load"]), len(counts["safe_open"]), len(counts["builds"])) == (1, 0, 1)


def test_a_dinov2_release_built_at_its_37_px_grid_once(tmp_path, counts):
    torch.save(release_weights(width=32, depth=2), tmp_path / "dinov2_vits14_pretrain.pth")
    model = create_backbone(
        "vit_small_patch14_dinov2", tmp_path / "dinov2_vits14_pretrain.pth", embed_dim=32, depth=2, num_heads=2
    )
    assert (len(counts["torch.load"]), len(counts["safe_open"]), counts["builds"]) == (
        1,
        0,
        ["vit_small_patch14_dinov2"],
    )
    assert tuple(model.patch_embed.grid_size) == (37, 37) and model.pos_embed_rule == "dino"


def test_the_reader_says_what_the_file_holds(tmp_path):
    """Container, trained patch and grid (the prefix tokens told from the file: class token, registers
    outside the position embedding) and the rule, without a model."""
    torch.manual_seed(0)
    reg = timm.create_model("vit_small_patch14_reg4_dinov2", num_classes=0, img_size=56, **NARROW)
    torch.save(
        {"student": {}, "teacher": {f"backbone.{k}": v for k, v in reg.state_dict().items()}}, tmp_path / "t.pth"
    )
    found = read_backbone_file(str(tmp_path / "t.pth"))
    assert (found.container, found.patch, found.grid, found.pos_embed_rule) == (
        "DINO training checkpoint",
        (14, 14),
        (4, 4),
        "dino",
    )
    assert found.build_kwargs({"img_size": 98}) == {"img_size": 98, "patch_size": 14}
    torch.save(
        {
            "pytorch-lightning_version": "2",
            "state_dict": {f"teacher.backbone.{k}": v for k, v in reg.state_dict().items()},
        },
        tmp_path / "l.ckpt",
    )
    found = read_backbone_file(str(tmp_path / "l.ckpt"))
    assert (found.container, found.grid, found.pos_embed_rule) == ("Lightning", (4, 4), "timm")
    assert found.build_kwargs({}) == {"patch_size": 14, "img_size": 56}
