"""Position embeddings at another grid: the reference DINO rule against an independent
implementation (bicubic convolution written out in NumPy), and which rule each checkpoint gets."""

import argparse
import copy

import numpy as np
import pytest
import timm
import torch

from locatdino.models import create_backbone, dense_features, dino_interpolate_pos_embed, set_pos_embed_rule

SMALL = dict(depth=2, embed_dim=64, num_heads=2)  # a 224 px (14 × 14) build grid, as DINO's


def _cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic convolution kernel with PyTorch's a = −0.75 (antialias=False)."""
    t = np.abs(t)
    return np.where(
        t <= 1, (a + 2) * t**3 - (a + 3) * t**2 + 1, np.where(t < 2, a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a, 0.0)
    )


def _bicubic_matrix(n_in: int, n_out: int, scale: float) -> np.ndarray:
    """``[n_out, n_in]`` weights of 1-D bicubic resampling by ``scale`` (half-pixel centres, the
    given scale factor used for the coordinates, border samples repeated)."""
    out = np.zeros((n_out, n_in))
    for i in range(n_out):
        src = (i + 0.5) / scale - 0.5
        base = int(np.floor(src))
        for j in range(base - 1, base + 3):
            out[i, min(max(j, 0), n_in - 1)] += _cubic(np.array(src - j))
    return out


def reference_pos_embed(pos_embed: torch.Tensor, height: int, width: int, patch: int) -> torch.Tensor:
    """DINO's ``interpolate_pos_encoding`` for an image ``height × width``: class token kept, the
    patch grid resized by ``(g + 0.1) / √N`` per axis (left alone at the training grid), computed
    in float64 NumPy."""
    pe = pos_embed.detach().double().numpy()[0]
    side = int(np.sqrt(pe.shape[0] - 1))
    gh, gw = height // patch, width // patch
    if gh * gw == side * side and gh == gw:
        return pos_embed
    rows = _bicubic_matrix(side, gh, (gh + 0.1) / side)
    cols = _bicubic_matrix(side, gw, (gw + 0.1) / side)
    grid = pe[1:].reshape(side, side, -1)
    resized = np.einsum("ai,ijc,bj->abc", rows, grid, cols).reshape(gh * gw, -1)
    return torch.from_numpy(np.concatenate([pe[:1], resized]))[None].float()


@pytest.fixture
def dino_file(tmp_path):
    """A released-DINO-format file: a plain ViT state dict without head, 224 px training grid."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=0, **SMALL)
    torch.nn.init.normal_(model.pos_embed, std=1.0)  # large, varied embeddings: the rules differ visibly
    path = tmp_path / "dino_vit_tiny.pth"
    torch.save(model.state_dict(), path)
    return path


def test_interpolation_equals_the_written_out_reference(dino_file):
    pos_embed = torch.load(dino_file, weights_only=True)["pos_embed"]
    for height, width in [(448, 448), (512, 384), (96, 96), (224, 224)]:
        ours = dino_interpolate_pos_embed(pos_embed, (height // 16, width // 16), num_prefix_tokens=1)
        torch.testing.assert_close(ours, reference_pos_embed(pos_embed, height, width, 16), rtol=0, atol=2e-5)


def test_dino_checkpoint_at_448_px_matches_a_model_built_with_the_reference_embedding(dino_file):
    """The patch tokens at 448 px of the loaded DINO file (rule chosen automatically) equal those
    of a fixed-size 448 px timm ViT whose pos_embed was resampled by the NumPy reference."""
    model = create_backbone("vit_tiny_patch16_224", dino_file, **SMALL).eval()
    assert model.pos_embed_rule == "dino" and model.patch_embed.grid_size == (14, 14)

    state = torch.load(dino_file, weights_only=True)
    state["pos_embed"] = reference_pos_embed(state["pos_embed"], 448, 448, 16)
    fixed = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=448, **SMALL).eval()
    fixed.load_state_dict(state, strict=True)

    x = torch.randn(2, 3, 448, 448, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, reference = dense_features(model, x), dense_features(fixed, x)
        timm_rule = dense_features(set_pos_embed_rule(copy.deepcopy(model), "timm"), x)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-4)
    assert (timm_rule - reference).abs().max() > 1e-2  # the test tells the two rules apart


def test_the_rule_each_checkpoint_gets_and_explicit_choice(dino_file, tmp_path):
    state = torch.load(dino_file, weights_only=True)
    assert create_backbone("vit_tiny_patch16_224", **SMALL).pos_embed_rule == "timm"  # random init
    assert create_backbone("vit_tiny_patch16_224", dino_file, pos_embed="timm", **SMALL).pos_embed_rule == "timm"

    full = {
        "student": {f"module.backbone.{k}": v for k, v in state.items()},
        "teacher": {f"backbone.{k}": v for k, v in state.items()},
        "args": argparse.Namespace(arch="vit_tiny"),
    }
    torch.save(full, tmp_path / "checkpoint.pth")
    assert create_backbone("vit_tiny_patch16_224", tmp_path / "checkpoint.pth", **SMALL).pos_embed_rule == "dino"

    lightning = {
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {f"teacher.backbone.{k}": v for k, v in state.items()},
    }
    torch.save(lightning, tmp_path / "last.ckpt")
    assert create_backbone("vit_tiny_patch16_224", tmp_path / "last.ckpt", **SMALL).pos_embed_rule == "timm"

    torch.manual_seed(0)
    torch.save(
        timm.create_model("locatvit_tiny_patch16_224", num_classes=0, **SMALL).state_dict(), tmp_path / "locatvit.pth"
    )
    assert create_backbone("locatvit_tiny_patch16_224", tmp_path / "locatvit.pth", **SMALL).pos_embed_rule == "timm"
    with pytest.raises(ValueError, match="pos_embed must be 'auto', 'timm' or 'dino', got 'bicubic'"):
        create_backbone("vit_tiny_patch16_224", dino_file, pos_embed="bicubic", **SMALL)


def test_the_rule_survives_deepcopy_and_keeps_the_training_grid(dino_file):
    model = create_backbone("vit_tiny_patch16_224", dino_file, **SMALL).eval()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.pos_embed.mul_(2)  # the copy's method must read the copy's weights
        x = torch.randn(1, 3, 224, 224)
        assert not torch.equal(model(x), twin(x))
        at_224 = timm.create_model("vit_tiny_patch16_224", num_classes=0, **SMALL).eval()
        at_224.load_state_dict(torch.load(dino_file, weights_only=True))
        torch.testing.assert_close(model(x), at_224(x), rtol=0, atol=0)  # no resampling at the training grid
    assert twin.pos_embed_rule == "dino"


def test_rebuilt_at_448_px_the_loaded_embedding_follows_the_same_rule(dino_file):
    """``img_size=448`` resamples pos_embed once at load time, by the same rule as at run time."""
    state = torch.load(dino_file, weights_only=True)
    rebuilt = create_backbone("vit_tiny_patch16_224", dino_file, img_size=448, **SMALL).eval()
    torch.testing.assert_close(
        rebuilt.pos_embed.detach(), reference_pos_embed(state["pos_embed"], 448, 448, 16), rtol=0, atol=2e-5
    )
    timm_rule = create_backbone("vit_tiny_patch16_224", dino_file, img_size=448, pos_embed="timm", **SMALL)
    assert (timm_rule.pos_embed - rebuilt.pos_embed).abs().max() > 1e-2


def test_the_position_rule_a_report_names(dino_file):
    """An absolute embedding's resampling rule; ``RoPE`` and ``relative`` where nothing is resampled."""
    from locatdino.models import position_rule
    from tests.models.tiny import TINY_SWIN

    assert position_rule(create_backbone("vit_tiny_patch16_224", dino_file, **SMALL)) == "dino"
    assert position_rule(create_backbone("vit_tiny_patch16_224", dino_file, pos_embed="timm", **SMALL)) == "timm"
    assert position_rule(create_backbone("vit_small_patch16_dinov3", **SMALL)) == "RoPE"
    assert position_rule(create_backbone("locatvit_tiny_rope_mixed", **SMALL)) == "RoPE"
    assert position_rule(create_backbone("locatswin_tiny", **TINY_SWIN)) == "relative"
