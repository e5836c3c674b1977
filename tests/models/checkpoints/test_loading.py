import argparse
import pathlib

import pytest
import timm
import torch

from locatdino.models import create_backbone, load_backbone_state_dict
from locatdino.models.checkpoints.mismatch import checkpoint_mismatch
from tests.models.tiny import TINY


@pytest.fixture
def vit_weights():
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", num_classes=0, **TINY).state_dict()


def _assert_loaded(model, state_dict):
    got = model.state_dict()
    for k, v in state_dict.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)


def test_plain_state_dict(tmp_path, vit_weights):
    torch.save(vit_weights, tmp_path / "dino_vit.pth")
    model = create_backbone("vit_tiny_patch16_224", tmp_path / "dino_vit.pth", **TINY)
    _assert_loaded(model, vit_weights)
    assert model(torch.randn(1, 3, 32, 48)).shape == (1, 64)  # dynamic size by default


def test_full_dino_training_checkpoint(tmp_path, vit_weights):
    student = {f"module.backbone.{k}": v + 1 for k, v in vit_weights.items()}
    student.update(
        {"module.head.last_layer.weight_g": torch.ones(8, 1), "module.head.last_layer.weight_v": torch.randn(8, 16)}
    )
    teacher = {f"backbone.{k}": v for k, v in vit_weights.items()}
    teacher.update({"head.last_layer.parametrizations.weight.original0": torch.ones(8, 1)})
    torch.save(
        {
            "student": student,
            "teacher": teacher,
            "optimizer": {"state": {}, "param_groups": []},
            "epoch": 3,
            "args": argparse.Namespace(arch="vit_tiny"),
            "dino_loss": {"center": torch.zeros(1, 8)},
        },
        tmp_path / "checkpoint.pth",
    )
    _assert_loaded(create_backbone("vit_tiny_patch16_224", tmp_path / "checkpoint.pth", **TINY), vit_weights)
    student_sd = load_backbone_state_dict(tmp_path / "checkpoint.pth", which="student")
    torch.testing.assert_close(student_sd["cls_token"], vit_weights["cls_token"] + 1)
    assert not any("head" in k for k in student_sd)


def test_lightning_checkpoint_with_gaug(tmp_path, tiny_locatvit):
    sd = tiny_locatvit.state_dict()
    state = {f"teacher.backbone.{k}": v for k, v in sd.items()}
    state.update({f"student.backbone.{k}": torch.zeros_like(v) for k, v in sd.items()})
    state["teacher.head.mlp.0.weight"] = torch.randn(4, 4)
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": state, "epoch": 1}, tmp_path / "last.ckpt")
    _assert_loaded(create_backbone("locatvit_tiny_patch16_224", tmp_path / "last.ckpt", **TINY), sd)


def test_public_locatvit_keys_load_strict_and_pos_embed_is_resampled(tmp_path):
    torch.manual_seed(0)
    public = timm.create_model(
        "locatvit_tiny_patch16_224", depth=2, embed_dim=64, num_heads=2
    )  # 224 px, 1000-class head
    sd = public.state_dict()
    assert {"blocks.1.attn.gaug.log_var.weight", "blocks.1.attn.gaug.log_alpha.bias", "head.weight"} <= set(sd)
    timm.create_model("locatvit_tiny_patch16_224", depth=2, embed_dim=64, num_heads=2).load_state_dict(sd, strict=True)
    torch.save({"state_dict": sd, "arch": "locatvit_tiny_patch16_224", "epoch": 300}, tmp_path / "locatvit.pth.tar")
    model = create_backbone("locatvit_tiny_patch16_224", tmp_path / "locatvit.pth.tar", **TINY)  # 64 px: 4×4 grid
    assert model.pos_embed.shape == (1, 17, 64)
    torch.testing.assert_close(model.blocks[1].attn.gaug.log_var.weight, sd["blocks.1.attn.gaug.log_var.weight"])


def test_clear_errors(tmp_path, vit_weights, tiny_locatvit):
    torch.save(vit_weights, tmp_path / "vit.pth")
    with pytest.raises(ValueError, match="vit.pth: .*no GAug parameters.*create vit_tiny_patch16_224 .*locatify"):
        create_backbone("locatvit_tiny_patch16_224", tmp_path / "vit.pth", **TINY)
    torch.save(tiny_locatvit.state_dict(), tmp_path / "locat.pth")
    with pytest.raises(
        ValueError, match=r"locat.pth: .* but vit_tiny_patch16_224 has none: use locatvit_tiny_patch16_224$"
    ):
        create_backbone("vit_tiny_patch16_224", tmp_path / "locat.pth", **TINY)
    sd = tiny_locatvit.state_dict()
    sd["blocks.0.attn.gaug.log_var.weight"] = torch.zeros(2, 16)
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(
        ValueError,
        match=r"bad.pth does not fit locatvit_tiny_patch16_224: blocks.0.attn.gaug.log_var.weight: "
        r"checkpoint \[2, 16\] vs model \[2, 32\]$",
    ):
        create_backbone("locatvit_tiny_patch16_224", tmp_path / "bad.pth", **TINY)
    torch.save({"epoch": 3, "weights": [1, 2]}, tmp_path / "odd.pth")
    with pytest.raises(ValueError, match="odd.pth: not a known checkpoint layout .*epoch, weights"):
        load_backbone_state_dict(tmp_path / "odd.pth")
    torch.save({"pytorch-lightning_version": "2", "state_dict": {"model.x": torch.zeros(1)}}, tmp_path / "l.ckpt")
    with pytest.raises(ValueError, match="no keys start with 'teacher.backbone.' .*model"):
        load_backbone_state_dict(tmp_path / "l.ckpt")
    del vit_weights["norm.bias"]
    torch.save(vit_weights, tmp_path / "short.pth")
    with pytest.raises(ValueError, match=r"short.pth does not fit vit_tiny_patch16_224: missing norm.bias$"):
        create_backbone("vit_tiny_patch16_224", tmp_path / "short.pth", **TINY)


def test_model_is_rebuilt_at_the_checkpoint_build_size(tmp_path):
    """A LocAtViT trained at 64 px loads as a 64 px model (GAug constants of a 4×4 build grid)
    unless img_size is given, in which case pos_embed is resampled to the requested grid."""
    torch.manual_seed(0)
    trained = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, **TINY).eval()
    torch.save(trained.state_dict(), tmp_path / "teacher.pth")
    small = dict(depth=2, embed_dim=64, num_heads=2)

    loaded = create_backbone("locatvit_tiny_patch16_224", tmp_path / "teacher.pth", **small).eval()
    assert loaded.patch_embed.grid_size == (4, 4)
    assert loaded.blocks[0].attn.gaug.c == 16.0
    x = torch.randn(2, 3, 96, 128)
    torch.testing.assert_close(loaded(x), trained(x), rtol=0, atol=0)

    rebuilt = create_backbone("locatvit_tiny_patch16_224", tmp_path / "teacher.pth", img_size=224, **small)
    assert rebuilt.patch_embed.grid_size == (14, 14) and rebuilt.blocks[0].attn.gaug.c == 196.0
    assert rebuilt.pos_embed.shape == (1, 1 + 14 * 14, 64)


def _meta_state_dict(name: str) -> dict[str, torch.Tensor]:
    """The state dict shapes of a full-size timm model, without allocating it."""
    with torch.device("meta"):
        return timm.create_model(name, num_classes=0).state_dict()


@pytest.mark.parametrize(
    "checkpoint_arch, model_arch, first, guess",
    [
        (
            "vit_base_patch16_224",
            "vit_small_patch16_224",
            "cls_token: checkpoint [1, 1, 768] vs model [1, 1, 384]; "
            "pos_embed: checkpoint [1, 197, 768] vs model [1, 197, 384]; patch_embed.proj.weight: checkpoint "
            "[768, 3, 16, 16] vs model [384, 3, 16, 16]; 147 more shapes differ",
            "a ViT-B/16 checkpoint for a ViT-S/16 model?",
        ),
        (
            "vit_small_patch8_224",
            "vit_small_patch16_224",
            "pos_embed: checkpoint [1, 785, 384] vs model [1, 197, 384]; "
            "patch_embed.proj.weight: checkpoint [384, 3, 8, 8] vs model [384, 3, 16, 16]",
            "a ViT-S/8 checkpoint for a ViT-S/16 model?",
        ),
        (
            "locatvit_tiny_patch16_224",
            "locatvit_small_patch16_224",
            "cls_token: checkpoint [1, 1, 192] vs model [1, 1, 384]",
            "a LocAtViT-T/16 checkpoint for a LocAtViT-S/16 model?",
        ),
    ],
)
def test_wrong_architecture_names_keys_shapes_and_both_architectures(checkpoint_arch, model_arch, first, guess):
    message = checkpoint_mismatch(_meta_state_dict(checkpoint_arch), _meta_state_dict(model_arch))
    assert message.startswith(first) and message.endswith(f" — {guess}") and "\n" not in message
    assert checkpoint_mismatch(_meta_state_dict(model_arch), _meta_state_dict(model_arch)) is None


def test_wrong_width_through_create_backbone_is_one_line_naming_the_file(tmp_path):
    torch.manual_seed(0)
    wide = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=64, depth=2, embed_dim=96, num_heads=2)
    torch.save(wide.state_dict(), tmp_path / "wide.pth")
    with pytest.raises(ValueError) as err:
        create_backbone("vit_tiny_patch16_224", tmp_path / "wide.pth", **TINY)
    message = str(err.value)
    assert message.startswith(
        f"{tmp_path / 'wide.pth'} does not fit vit_tiny_patch16_224: cls_token: "
        "checkpoint [1, 1, 96] vs model [1, 1, 64]; "
    )
    assert (
        message.endswith(
            "more shapes differ — a ViT (width 96, 2 blocks, /16) checkpoint for a ViT (width 64, 2 blocks, /16) model?"
        )
        and "\n" not in message
    )


def test_unreadable_files_are_named_in_a_plain_sentence(tmp_path):
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "notes.pth").write_text("<html><body>404 Not Found</body></html>\n")
    (tmp_path / "lfs.pth").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")
    (tmp_path / "noise.pth").write_bytes(bytes(range(7, 200)))
    torch.save({"path": pathlib.PurePosixPath("runs")}, tmp_path / "objects.pth")
    expected = {
        "empty.pth": "is empty (0 bytes), not a checkpoint",
        "notes.pth": "is a text file, not a torch checkpoint "
        "(it starts with '<html><body>404 Not Found</body></html>')",
        "lfs.pth": "is a Git LFS pointer, not the weights: fetch them with `git lfs pull`",
        "noise.pth": "is not a torch checkpoint (neither torch's zip format nor a pickle; 193 bytes)",
        "objects.pth": "cannot be read with weights_only=True (unsupported global: GLOBAL pathlib.PurePosixPath)",
        "missing.pth": "no such file",
        "": "is a folder without model.safetensors or pytorch_model.bin",
    }
    for name, sentence in expected.items():
        path = tmp_path / name
        with pytest.raises(ValueError) as err:
            create_backbone("vit_tiny_patch16_224", path, **TINY)
        assert str(err.value).startswith(f"{path}: {sentence}"), str(err.value)
        assert "\n" not in str(err.value) and "Weights only load failed" not in str(err.value)


def test_a_pretrained_tag_without_checkpoint_is_refused():
    with pytest.raises(
        ValueError,
        match=r"^vit_small_patch16_224.dino names timm's pretrained weights 'dino', which "
        r"locatdino never downloads: pass the weights file \(dino_deitsmall16_pretrain.pth\) "
        r"as the checkpoint, or use vit_small_patch16_224 for a random init$",
    ):
        create_backbone("vit_small_patch16_224.dino")


def test_patch_size_and_build_size_come_from_the_checkpoint(tmp_path):
    """A patch-8, 64 px run (the tiny recipes) reloads as patch 8 at 64 px: 8 x 8 grid, same weights."""
    torch.manual_seed(0)
    trained = timm.create_model(
        "locatvit_tiny_patch16_224", depth=2, embed_dim=64, num_heads=2, img_size=64, patch_size=8, num_classes=0
    )
    torch.save(trained.state_dict(), tmp_path / "teacher.pth")
    model = create_backbone("locatvit_tiny_patch16_224", tmp_path / "teacher.pth", depth=2, embed_dim=64, num_heads=2)
    assert model.patch_embed.patch_size == (8, 8) and model.pos_embed.shape == (1, 65, 64)
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(model.eval()(x), trained.eval()(x))


def test_mmap_load_maps_zip_files_and_reads_legacy_pickles_whole(tmp_path, vit_weights):
    """``load_checkpoint(mmap=True)`` (the resume check reads only hyper-parameters) gives the same
    tensors as a plain load, memory-mapped for torch's zip format; a legacy pickle, which torch
    cannot map, is read whole instead of failing."""
    from locatdino.models.checkpoints.contents import load_checkpoint

    torch.save(vit_weights, tmp_path / "zip.pth")
    torch.save(vit_weights, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    for name in ("zip.pth", "legacy.pth"):
        loaded = load_checkpoint(tmp_path / name, mmap=True)
        assert loaded.keys() == vit_weights.keys()
        for k, v in vit_weights.items():
            torch.testing.assert_close(loaded[k], v, rtol=0, atol=0, msg=k)
    with pytest.raises(RuntimeError, match="mmap"):  # what the zip check spares legacy files
        torch.load(tmp_path / "legacy.pth", weights_only=True, mmap=True)


def test_integer_tensors_for_float_parameters_are_named_with_their_dtype(vit_weights):
    """An int8 or bool tensor went into a float parameter without a word; fp16 / bf16 cast exactly."""
    assert checkpoint_mismatch({k: v.half() for k, v in vit_weights.items()}, vit_weights) is None
    assert checkpoint_mismatch({k: v.bfloat16() for k, v in vit_weights.items()}, vit_weights) is None
    one = {**vit_weights, "norm.bias": vit_weights["norm.bias"].to(torch.int8)}
    assert checkpoint_mismatch(one, vit_weights) == (
        "norm.bias is int8 in the file but float32 in the model: not floating-point weights (a quantised "
        "or damaged file, or a safetensors header that misstates the dtype?)"
    )
    two = {**one, "cls_token": vit_weights["cls_token"].bool()}
    assert checkpoint_mismatch(two, vit_weights).startswith(
        "cls_token is bool in the file but float32 in the model (and 1 more tensor)"
    )
