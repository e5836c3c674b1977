"""LocAt on Swin against the official equations, written here independently of the package.

The reference is timm's ``SwinTransformer`` whose window attention is replaced by a naive forward of
the official ``LocAtWindowAttention`` (GAug over each window's grid, added to the relative-position
bias and the shift mask before the softmax) and whose head is preceded by the official PRR
(q = k = v = the last stage's tokens split into its heads). Its parameters carry the official names,
so the strict state-dict loads both ways are the official checkpoint's.
"""

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from torch import nn

import locatdino  # noqa: F401  (registers locatswin_*)
from locatdino.models import locatify
from locatdino.models.swin import LocAtSwin, LocAtWindowAttention
from tests.models.tiny import TINY_SWIN


class OfficialGaug(nn.Module):
    """The official GaussianAugment's parameters and its ``addition_2d`` for a grid without prefix tokens."""

    def __init__(self, head_dim: int, grid: tuple[int, int]) -> None:
        super().__init__()
        self.log_var, self.log_alpha, self.grid = nn.Linear(head_dim, 2), nn.Linear(head_dim, 1), grid

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        g = max(self.grid)
        coef = float(g * g)
        shift = math.log(coef - 1) if coef > 2 else 0.0
        eps = 0.1
        while 0.5 * (g - 1) ** 2 / eps**2 > 65000 / 2:
            eps *= 2
        var = coef * torch.sigmoid(self.log_var(q) - shift)  # [B, H, N, 2]
        alpha = F.softplus(self.log_alpha(q))  # [B, H, N, 1]
        i, j = torch.meshgrid(torch.arange(self.grid[0]), torch.arange(self.grid[1]), indexing="ij")
        pos = torch.stack([i, j], dim=-1).reshape(-1, 2).float()
        d = -0.5 * (pos[None, :, :] - pos[:, None, :]) ** 2  # [N, N, 2]: query row, key column
        d = d.clamp(min=max(-0.5 * (g - 1) ** 2, -6550.0))
        return alpha * torch.exp((d / (var.unsqueeze(3) + eps)).sum(-1))


class OfficialWindowAttention(WindowAttention):
    """Naive softmax(q kᵀ·scale + relative-position bias + shift mask + GAug) v."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B_, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        table = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        attn = (q * self.scale) @ k.transpose(-2, -1) + table.view(N, N, -1).permute(2, 0, 1)
        if mask is not None:
            attn = (attn.view(-1, mask.shape[0], self.num_heads, N, N) + mask[None, :, None]).view(B_, -1, N, N)
        attn = torch.softmax(attn + self.gaug(q), dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, -1))


class OfficialLocAtSwin(SwinTransformer):
    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        heads = self.layers[-1].blocks[0].attn.num_heads
        t = x.flatten(1, 2)
        t = t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)
        t = torch.softmax(t @ t.transpose(-2, -1) / math.sqrt(t.shape[-1]), dim=-1) @ t
        return super().forward_head(t.transpose(1, 2).reshape(x.shape), pre_logits)


def official_locatswin(**kwargs) -> OfficialLocAtSwin:
    model = SwinTransformer(**kwargs)
    model.__class__ = OfficialLocAtSwin
    for module in model.modules():
        if type(module) is WindowAttention:
            module.__class__ = OfficialWindowAttention
            module.gaug = OfficialGaug(module.qkv.in_features // module.num_heads, module.window_size)
    return model


def spread_gaug(model: nn.Module, seed: int = 1) -> None:
    """GAug weights far from their init, so that variances and amplitudes differ per query."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".gaug." in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if name.endswith("weight") else 1.0))


@pytest.fixture
def pair():
    torch.manual_seed(0)
    ours = timm.create_model("locatswin_tiny", num_classes=5, **TINY_SWIN).eval()
    spread_gaug(ours)
    reference = official_locatswin(num_classes=5, **TINY_SWIN).eval()
    reference.load_state_dict(ours.state_dict(), strict=True)
    return ours, reference


@pytest.mark.parametrize("fused", [True, False])
def test_forward_and_gradients_equal_the_official_equations(pair, fused):
    ours, reference = pair
    for module in ours.modules():
        if isinstance(module, LocAtWindowAttention):
            module.fused_attn = fused
    x = torch.randn(2, 3, 56, 56)
    out, ref = ours(x), reference(x)
    assert out.shape == (2, 5)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)  # fp32, different summation orders
    out.square().sum().backward()
    ref.square().sum().backward()
    grads = dict(reference.named_parameters())
    for name, p in ours.named_parameters():
        if ".gaug." in name or "relative_position" in name:
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-3, atol=1e-6, msg=name)


def test_gaug_changes_the_output(pair):
    """The comparison above is not vacuous: without GAug the reference gives another output."""
    ours, reference = pair
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, OfficialGaug):
                module.log_alpha.bias.fill_(-60.0)  # alpha ≈ 0
    x = torch.randn(1, 3, 56, 56)
    assert (ours(x) - reference(x)).abs().max() > 1e-3


def test_state_dict_is_the_official_one_both_ways(pair):
    ours, reference = pair
    assert ours.state_dict().keys() == reference.state_dict().keys()
    fresh = timm.create_model("locatswin_tiny", num_classes=5, **TINY_SWIN)
    fresh.load_state_dict(reference.state_dict(), strict=True)
    gaug = [k for k in fresh.state_dict() if ".attn.gaug." in k]
    assert len(gaug) == 4 * 8  # log_var / log_alpha weight + bias in each of the 8 blocks
    assert gaug[0] == "layers.0.blocks.0.attn.gaug.log_var.weight"


def test_gaug_runs_on_each_window_grid():
    """GAug's constants come from the window (build grid), not the image: c = 16 for 4 × 4, and a
    window clipped to a smaller map (the last stage's 2 × 2) uses its own grid."""
    model = timm.create_model("locatswin_tiny", **TINY_SWIN)
    grids = [m.gaug.build_grid for m in model.modules() if isinstance(m, LocAtWindowAttention)]
    assert grids == [(4, 4)] * 6 + [(2, 2)] * 2
    assert model.layers[0].blocks[0].attn.gaug.c == 16.0


@pytest.mark.parametrize(
    ("name", "swin", "blocks", "head_dim"),
    [
        ("locatswin_tiny", "swin_tiny_patch4_window7_224", 12, 32),
        ("locatswin_base", "swin_base_patch4_window7_224", 24, 32),
    ],
)
def test_registered_sizes_add_three_per_head_dim_plus_three_per_block(name, swin, blocks, head_dim):
    with torch.device("meta"):
        ours, vanilla = timm.create_model(name), timm.create_model(swin)
    assert isinstance(ours, LocAtSwin)
    assert ours.state_dict().keys() - vanilla.state_dict().keys() == {
        k for k in ours.state_dict() if ".attn.gaug." in k
    }
    extra = sum(p.numel() for p in ours.parameters()) - sum(p.numel() for p in vanilla.parameters())
    assert extra == blocks * (3 * head_dim + 3)  # 1,188 for Swin-T, 2,376 for Swin-B


def test_locatify_keeps_every_swin_weight_and_alpha_zero_without_prr_is_vanilla():
    torch.manual_seed(0)
    swin = timm.create_model("swin_tiny_patch4_window7_224", num_classes=0, **TINY_SWIN).eval()
    before = {k: v.clone() for k, v in swin.state_dict().items()}
    x = torch.randn(1, 3, 56, 56)
    expected = swin(x)
    assert locatify(swin, prr=False) is swin and isinstance(swin, LocAtSwin) and swin.prr is None
    after = swin.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert {k for k in after if k not in before} == {k for k in after if ".attn.gaug." in k}
    with torch.no_grad():
        for module in swin.modules():
            if isinstance(module, LocAtWindowAttention):
                module.gaug.log_alpha.bias.fill_(-60.0)
    torch.testing.assert_close(swin(x), expected, rtol=1e-5, atol=1e-6)
    locatify(swin, gaug=False, prr=True)  # PRR added afterwards: the pooled feature changes
    assert swin.prr.num_heads == 8 and (swin(x) - expected).abs().max() > 1e-3


def test_locatify_swin_refuses_other_models():
    from locatdino.models.swin import locatify_swin

    with pytest.raises(TypeError, match="needs a timm SwinTransformer, got Linear"):
        locatify_swin(nn.Linear(2, 2))


def test_a_locatswin_file_loads_into_its_name_and_is_refused_by_a_vit(pair, tmp_path):
    from locatdino.models import create_backbone

    ours, _ = pair
    path = tmp_path / "locatswin.pth"
    torch.save({k: v for k, v in ours.state_dict().items() if not k.startswith("head.")}, path)
    loaded = create_backbone("locatswin_tiny", path, **TINY_SWIN).eval()
    assert isinstance(loaded, LocAtSwin)
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ours.forward_head(ours.forward_features(x), pre_logits=True))
    with pytest.raises(ValueError) as err:  # a LocAtSwin file under a ViT name: named as Swin before any key check
        create_backbone("vit_small_patch16_224", path)
    assert str(err.value) == (
        f"{path}: holds a Swin Transformer (16 wide, depths 2-2-2-2, /4) but vit_small_patch16_224 is a "
        "VisionTransformer: name the Swin model the file is for"
    )
    torch.manual_seed(0)
    swin = timm.create_model("swin_tiny_patch4_window7_224", num_classes=0, **TINY_SWIN)
    torch.save(swin.state_dict(), path)
    with pytest.raises(ValueError) as err:  # a plain Swin file: the same line
        create_backbone("vit_small_patch16_224", path)
    assert str(err.value).startswith(f"{path}: holds a Swin Transformer (16 wide, depths 2-2-2-2, /4) but")


def test_gaug_refusals_name_the_swin_entries(pair, tmp_path):
    from locatdino.models import create_backbone

    ours, _ = pair
    locat, vanilla = tmp_path / "locatswin.pth", tmp_path / "swin.pth"
    torch.save({k: v for k, v in ours.state_dict().items() if not k.startswith("head.")}, locat)
    torch.save({k: v for k, v in ours.state_dict().items() if ".gaug." not in k and not k.startswith("head.")}, vanilla)
    with pytest.raises(ValueError) as err:
        create_backbone("swin_tiny_patch4_window7_224", locat, **TINY_SWIN)
    assert str(err.value) == (
        f"{locat}: checkpoint has GAug parameters (layers.*.blocks.*.attn.gaug.*) but swin_tiny_patch4_window7_224 "
        "has none: use locatswin_tiny"
    )
    with pytest.raises(ValueError) as err:
        create_backbone("locatswin_base", vanilla, **TINY_SWIN)
    assert str(err.value) == (
        f"{vanilla}: checkpoint has no GAug parameters (layers.*.blocks.*.attn.gaug.*) but locatswin_base is a "
        "LocAtSwin: create swin_base_patch4_window7_224 from it and call locatdino.models.locatify(model) to add "
        "freshly initialised GAug"
    )


def test_describe_architecture_reads_swin_sizes_depths_and_gaug(pair):
    from locatdino.models.checkpoints.mismatch import checkpoint_mismatch, describe_architecture

    ours, _ = pair
    assert describe_architecture(ours.state_dict()) == "LocAtSwin (width 16, depths 2-2-2-2, /4)"
    tiny = timm.create_model("swin_tiny_patch4_window7_224").state_dict()
    base = timm.create_model("swin_base_patch4_window7_224").state_dict()
    assert describe_architecture(tiny) == "Swin-T/4"
    assert describe_architecture(base) == "Swin-B/4"
    assert checkpoint_mismatch(base, tiny).endswith(" — a Swin-B/4 checkpoint for a Swin-T/4 model?")


def test_a_swin_file_is_built_once(pair, tmp_path, monkeypatch):
    """The patch compared with the file's is the patch embedding's (4 px), not the last stage's token (32 px)."""
    from locatdino.models import create_backbone
    from locatdino.models.checkpoints import loading

    ours, _ = pair
    torch.save({k: v for k, v in ours.state_dict().items() if not k.startswith("head.")}, tmp_path / "s.pth")
    builds, create = [], timm.create_model

    def counted(*args, **kwargs):
        builds.append(args[0])
        return create(*args, **kwargs)

    monkeypatch.setattr(loading.timm, "create_model", counted)
    create_backbone("locatswin_tiny", tmp_path / "s.pth", **TINY_SWIN)
    assert builds == ["locatswin_tiny"]
