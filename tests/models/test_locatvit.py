import pytest
import timm
import torch

from locatdino.models.gaug import locality_bias
from tests.models.tiny import TINY

VARIANTS = timm.list_models("locatvit_*_patch*_224")  # the ViT entries (RoPE ones: test_locat_rope.py)
SIZES = {"tiny": "Ti", "small": "S", "base": "B"}  # the ViT papers' names of the sizes


def test_registry_lists_one_entry_per_architecture_named_as_timm_names_vits():
    assert VARIANTS == [
        "locatvit_base_patch16_224",
        "locatvit_small_patch16_224",
        "locatvit_tiny_patch8_224",
        "locatvit_tiny_patch16_224",
    ]
    for name in VARIANTS:
        cfg = timm.models.get_pretrained_cfg(name)
        size, patch = name.split("_")[1], int(name.split("_patch")[1].split("_")[0])
        assert f"ViT-{SIZES[size]}/{patch} with GAug" in cfg.description
        assert not cfg.has_weights and cfg.input_size == (3, 224, 224)
        with torch.device("meta"):
            assert timm.create_model(name).patch_embed.patch_size == (patch, patch)


@pytest.mark.parametrize(
    "old, new",
    [
        ("locatvit_tiny", "locatvit_tiny_patch16_224"),
        ("locatvit_small", "locatvit_small_patch16_224"),
        ("locatvit_base", "locatvit_base_patch16_224"),
    ],
)
def test_the_earlier_short_names_warn_and_create_the_same_model(old, new):
    assert timm.models.get_deprecated_models()[old] == new and old not in timm.list_models("locatvit*")
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=f"Mapping deprecated model name {old} to current {new}"):
        made = timm.create_model(old, depth=2, img_size=32)
    torch.manual_seed(0)
    current = timm.create_model(new, depth=2, img_size=32)
    assert made.pretrained_cfg["architecture"] == new
    assert {k: v.shape for k, v in made.state_dict().items()} == {k: v.shape for k, v in current.state_dict().items()}
    assert all(torch.equal(a, b) for a, b in zip(made.state_dict().values(), current.state_dict().values()))


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_forward_backward_features(name):
    model = timm.create_model(name, num_classes=0, depth=1, img_size=32)
    dims = {"tiny": 192, "small": 384, "base": 768}  # patch 8 or 16: the same number of GAug parameters
    assert model.embed_dim == dims[name.split("_")[1]] and model.global_pool == "prr"
    assert model.dynamic_img_size
    n_gaug = sum(p.numel() for k, p in model.named_parameters() if ".attn.gaug." in k)
    assert n_gaug == 3 * 64 + 3
    out = model(torch.randn(2, 3, 48, 32))
    assert out.shape == (2, model.embed_dim)
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_class_token_loss_reaches_every_gaug_parameter(tiny_locatvit):
    tiny_locatvit.train()
    tiny_locatvit(torch.randn(2, 3, 64, 64)).square().sum().backward()
    grads = {k: p.grad for k, p in tiny_locatvit.named_parameters() if ".attn.gaug." in k}
    assert len(grads) == 8
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_without_prr_the_last_blocks_gaug_gets_no_class_token_gradient():
    """Why PRR: GAug only biases patch rows, and the class token of the last block reads patch
    outputs of the block before, so without PRR the last block's GAug is unreachable."""
    torch.manual_seed(0)
    model = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, global_pool="token", **TINY).train()
    model(torch.randn(2, 3, 64, 64)).square().sum().backward()
    assert model.blocks[0].attn.gaug.log_var.weight.grad.abs().sum() > 0
    last = model.blocks[-1].attn.gaug
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in last.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [512, 1024])
def test_finite_under_autocast_at_large_inputs(dtype, size):
    torch.manual_seed(0)
    model = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, depth=1, embed_dim=32, num_heads=1).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        out = model(torch.randn(1, 3, size, size))
    assert torch.isfinite(out).all()


def test_training_step_at_512_px_under_bf16_uses_fast_mode(monkeypatch):
    """A 32×32 grid in training takes the reference's fast path (profiles predicted on the 16×16
    coarse grid); loss and gradients stay finite."""
    profile_grids = []
    expand = locality_bias._expand_coarse
    monkeypatch.setattr(
        locality_bias,
        "_expand_coarse",
        lambda profile, grid: profile_grids.append(profile.shape[-2]) or expand(profile, grid),
    )
    torch.manual_seed(0)
    model = timm.create_model("locatvit_tiny_patch16_224", num_classes=0, depth=1, embed_dim=32, num_heads=1).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(1, 3, 512, 512)).float().square().mean()
    loss.backward()
    assert profile_grids == [16 * 16] * 2  # rows and columns, predicted on the coarse grid
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_features_only_model_is_wired():
    model = timm.create_model("locatvit_tiny_patch16_224", features_only=True, out_indices=(0, 1), **TINY)
    feats = model(torch.randn(1, 3, 64, 48))
    assert [f.shape for f in feats] == [(1, 64, 4, 3)] * 2
