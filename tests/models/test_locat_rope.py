"""LocAt on RoPE ViTs (timm's ``Eva``) against the official equations, written out here.

The official ``GaussianAugmentedAttentionRope`` computes GAug's bias S from the patch queries after
q-norm and *before* the rotary embedding, rotates q and k of the patch tokens (prefix tokens
unrotated), and adds S to the logits; the official ``LocAtRoPEViT`` refines the final tokens with
PRR and pools the class token. :func:`official_forward` is that model from its state dict alone
(mixed-mode RoPE as complex rotations of consecutive pairs, GAug from its formula with an explicit
``N × N`` kernel), in float64; the registered ``locatvit_tiny_rope_mixed`` must give its numbers,
and must not give those of the same forward with S from the rotated queries.
"""

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.eva import Eva

import locatdino.models.gaug.attention as gaug_attention
from locatdino.models import locatify
from locatdino.models.rope import GAugAttentionRope, GAugEvaAttention

# the official locatvit_*_rope_mixed arguments of timm's Eva (its class subclasses Eva, names unchanged)
OFFICIAL_ROPE_MIXED = dict(
    patch_size=16,
    mlp_ratio=4,
    qkv_bias=True,
    attn_type="rope",
    init_values=1e-5,
    class_token=True,
    global_pool="token",
    use_abs_pos_emb=False,
    use_rot_pos_emb=True,
    rope_grid_indexing="xy",
    rope_temperature=10.0,
    rope_type="mixed",
)
TINY_ROPE = dict(embed_dim=192, depth=12, num_heads=3)  # locatvit_tiny_rope_mixed


def gaug_bias(q: torch.Tensor, prefix: str, sd: dict, grid: tuple, build_grid: tuple) -> torch.Tensor:
    """The official GAug addition ``[B, H, N, N]`` of the queries ``q [B, H, N, d]`` (1 prefix token)."""
    G = max(build_grid)
    c = float(G * G)
    shift = math.log(c - 1)
    eps = 0.1
    while 0.5 * (G - 1) ** 2 / eps**2 > 65000 / 2:
        eps *= 2
    patches = q[:, :, 1:]
    var = c * torch.sigmoid(
        F.linear(patches, sd.pop(f"{prefix}.log_var.weight"), sd.pop(f"{prefix}.log_var.bias")) - shift
    )
    if tuple(grid) != tuple(build_grid):
        var = var * (min(grid) / min(build_grid))
    alpha = F.softplus(F.linear(patches, sd.pop(f"{prefix}.log_alpha.weight"), sd.pop(f"{prefix}.log_alpha.bias")))
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    pos = torch.stack([rows, cols], -1).reshape(-1, 2).to(q.dtype)
    d = (-0.5 * (pos[:, None] - pos[None]) ** 2).clamp(min=max(-0.5 * (G - 1) ** 2, -6550.0))  # [Np, Np, 2]
    s = alpha * torch.exp((d / (var[:, :, :, None, :] + eps)).sum(-1))
    return F.pad(s, (1, 0, 1, 0))


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE: each consecutive pair ``(x[2f], x[2f+1])`` turned by ``angles[..., f]`` (complex product)."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def mixed_angles(freqs: torch.Tensor, grid: tuple) -> torch.Tensor:
    """Mixed-mode RoPE angles ``[H, Np, d/2]`` of one block: ``x·f_x + y·f_y`` per head and pair, x the
    column and y the row of the patch (``xy`` indexing); ``freqs [2, H, d/2]``."""
    y, x = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    x, y = x.flatten().to(freqs.dtype), y.flatten().to(freqs.dtype)
    return x[None, :, None] * freqs[0][:, None] + y[None, :, None] * freqs[1][:, None]


def official_forward(
    state_dict: dict, images: torch.Tensor, heads: int, build_grid=(14, 14), gaug_from_rotated: bool = False
) -> torch.Tensor:
    """The official LocAt mixed-RoPE ViT's logits from its state dict; every key must be used once."""
    sd = dict(state_dict)
    B = images.shape[0]
    t = F.conv2d(images, sd.pop("patch_embed.proj.weight"), sd.pop("patch_embed.proj.bias"), stride=16)
    grid = tuple(t.shape[-2:])
    t = torch.cat([sd.pop("cls_token").expand(B, -1, -1), t.flatten(2).transpose(1, 2)], 1)
    N, D = t.shape[1:]
    d = D // heads
    freqs = sd.pop("rope.freqs")  # [2, depth, H, d/2]
    for i in range(freqs.shape[1]):

        def p(name, i=i):
            return sd.pop(f"blocks.{i}.{name}")

        y = F.layer_norm(t, (D,), p("norm1.weight"), p("norm1.bias"), eps=1e-6)
        q, k, v = (
            F.linear(y, p("attn.qkv.weight"), p("attn.qkv.bias")).reshape(B, N, 3, heads, d).permute(2, 0, 3, 1, 4)
        )
        angles = mixed_angles(freqs[:, i], grid)
        rq = torch.cat([q[:, :, :1], rotate_pairs(q[:, :, 1:], angles)], 2)
        rk = torch.cat([k[:, :, :1], rotate_pairs(k[:, :, 1:], angles)], 2)
        s = gaug_bias(rq if gaug_from_rotated else q, f"blocks.{i}.attn.gaug", sd, grid, build_grid)
        attn = torch.softmax(rq @ rk.transpose(-2, -1) / math.sqrt(d) + s, -1) @ v
        t = t + p("gamma_1") * F.linear(
            attn.transpose(1, 2).reshape(B, N, D), p("attn.proj.weight"), p("attn.proj.bias")
        )
        y = F.layer_norm(t, (D,), p("norm2.weight"), p("norm2.bias"), eps=1e-6)
        mlp = F.linear(
            F.gelu(F.linear(y, p("mlp.fc1.weight"), p("mlp.fc1.bias"))), p("mlp.fc2.weight"), p("mlp.fc2.bias")
        )
        t = t + p("gamma_2") * mlp
    t = F.layer_norm(t, (D,), sd.pop("norm.weight"), sd.pop("norm.bias"), eps=1e-6)
    x = t.reshape(B, N, heads, d).transpose(1, 2)  # PRR: q = k = v = the tokens, per head
    x = (torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(d), -1) @ x).transpose(1, 2).reshape(B, N, D)
    logits = F.linear(x[:, 0], sd.pop("head.weight"), sd.pop("head.bias"))
    assert not sd, f"keys the official model does not have: {sorted(sd)}"
    return logits


def official_state_dict(seed: int = 0) -> dict:
    """A state dict in the official layout, made without locatdino: timm's vanilla Eva with the
    official arguments, GAug's two linears per block, all randomised (LayerScale near 1 so that every
    block counts, GAug strong enough to matter)."""
    torch.manual_seed(seed)
    vanilla = Eva(num_classes=10, **OFFICIAL_ROPE_MIXED, **TINY_ROPE).double()
    sd = {k: v.clone() for k, v in vanilla.state_dict().items()}
    d = TINY_ROPE["embed_dim"] // TINY_ROPE["num_heads"]
    g = torch.Generator().manual_seed(seed)
    for i in range(TINY_ROPE["depth"]):
        sd[f"blocks.{i}.gamma_1"] = 1 + 0.1 * torch.randn(
            sd[f"blocks.{i}.gamma_1"].shape, generator=g, dtype=torch.float64
        )
        sd[f"blocks.{i}.gamma_2"] = 1 + 0.1 * torch.randn(
            sd[f"blocks.{i}.gamma_2"].shape, generator=g, dtype=torch.float64
        )
        for name, out in (("log_var", 2), ("log_alpha", 1)):
            sd[f"blocks.{i}.attn.gaug.{name}.weight"] = 0.3 * torch.randn(out, d, generator=g, dtype=torch.float64)
            sd[f"blocks.{i}.attn.gaug.{name}.bias"] = torch.randn(out, generator=g, dtype=torch.float64) + 1
    sd["head.weight"] = torch.randn(sd["head.weight"].shape, generator=g, dtype=torch.float64)
    return sd


@pytest.fixture(scope="module")
def official():
    return official_state_dict()


def _locat_tiny_rope(**kwargs) -> Eva:
    return timm.create_model("locatvit_tiny_rope_mixed", num_classes=10, **kwargs).double().eval()


def test_the_state_dict_is_the_official_layout_both_ways(official):
    model = _locat_tiny_rope()
    ours = model.state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in official.items()}
    model.load_state_dict(official, strict=True)
    d = 64
    added = sum(p.numel() for n, p in model.named_parameters() if ".gaug." in n)
    assert added == 12 * (3 * d + 3) == 2340
    # and the official layout (without dynamic image size, its default) takes ours
    _locat_tiny_rope(dynamic_img_size=False).load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("size", [(224, 224), (160, 224)], ids=["build grid 14x14", "grid 10x14"])
def test_output_equals_the_official_equations(official, size):
    """Logits of the registered model = the official forward, at the build grid and at a
    non-square grid (GAug's variance rescaled, rows and columns not interchangeable); GAug from
    the rotated queries gives other numbers (the test can tell the order apart)."""
    model = _locat_tiny_rope()
    model.load_state_dict(official)
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        got = model(images)
    want = official_forward(official, images, heads=3)
    # fp64, but timm computes the RoPE angles and their sin / cos in fp32 (8e-8 relative here)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    wrong = official_forward(official, images, heads=3, gaug_from_rotated=True)
    assert (wrong - want).abs().max() > 100 * 1e-6 * want.abs().max()  # 100× the tolerance above


def test_training_forward_and_gradients_equal_the_official_equations(official, monkeypatch):
    """Training on the CPU takes the fused separable kernel in every block (no ``N × N`` bias is
    built: the mask builder is made to fail), and its loss and input gradient are the official
    forward's."""
    calls = []
    separable = gaug_attention.separable_bias_attention
    monkeypatch.setattr(gaug_attention, "separable_bias_attention", lambda *a: calls.append(1) or separable(*a))

    def no_mask(*args):
        raise AssertionError("a B×H×N×N bias was built in training")

    monkeypatch.setattr(gaug_attention, "outer_product_mask", no_mask)
    model = _locat_tiny_rope().train()
    model.load_state_dict(official)
    images = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = images.clone().requires_grad_(True)
    model(x).square().sum().backward()
    assert len(calls) == 12
    x_ref = images.clone().requires_grad_(True)
    official_forward(official, x_ref, heads=3).square().sum().backward()
    # fp64 but for timm's fp32 RoPE angles (see above)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-6 * float(x_ref.grad.abs().max()))


def _rotate_half(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """RoPE in the 'half' layout (DINOv3): x = (a, b) halves turned by the angles of sin / cos."""
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def _tiny_dinov3(name: str = "vit_small_patch16_dinov3_qkvb") -> Eva:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=0, img_size=64, depth=2, embed_dim=64, num_heads=2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("q_bias", "v_bias", "gamma_1", "gamma_2")):
                p.normal_(0.5, 0.2)  # non-zero biases, LayerScale that lets every block count
    return model.double().eval()


@pytest.mark.parametrize("from_rotated", [False, True], ids=["GAug before RoPE", "GAug after RoPE"])
def test_dinov3_attention_takes_gaug_from_the_queries_before_rope(from_rotated):
    """One DINOv3 block's attention (q / v biases, 4 registers and the class token unrotated,
    'half' RoPE layout) against the official equations written out; only GAug from the
    unrotated queries gives its numbers."""
    model = locatify(_tiny_dinov3(), prr=False)
    attn = model.blocks[0].attn
    assert isinstance(attn, GAugEvaAttention)
    with torch.no_grad():
        for p in attn.gaug.parameters():
            p.normal_(0.5, 0.5)
    grid, npt = (4, 3), 5
    model.patch_embed.patch_grid.record(grid)
    x = torch.randn(2, npt + 12, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rope = model.rope.get_embed(shape=list(grid))
    with torch.no_grad():
        got = attn(x, rope=rope)
    sd = {k: v for k, v in attn.state_dict().items()}
    bias = torch.cat([sd.pop("q_bias"), torch.zeros_like(sd["v_bias"]), sd.pop("v_bias")])
    q, k, v = F.linear(x, sd.pop("qkv.weight"), bias).reshape(2, -1, 3, 2, 32).permute(2, 0, 3, 1, 4)
    sin, cos = rope.chunk(2, -1)
    rq = torch.cat([q[:, :, :npt], _rotate_half(q[:, :, npt:], sin, cos)], 2)
    rk = torch.cat([k[:, :, :npt], _rotate_half(k[:, :, npt:], sin, cos)], 2)
    s = gaug_bias((rq if from_rotated else q)[:, :, npt - 1 :], "gaug", sd, grid, (4, 4))
    s = F.pad(s, (npt - 1, 0, npt - 1, 0))
    out = (torch.softmax(rq @ rk.transpose(-2, -1) / math.sqrt(32) + s, -1) @ v).transpose(1, 2).reshape(2, -1, 64)
    want = F.linear(out, sd.pop("proj.weight"), sd.pop("proj.bias"))
    if from_rotated:
        assert (got - want).abs().max() > 1e-3 * want.abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("vit_small_patch16_dinov3_qkvb", dict(img_size=64)),
        ("vit_small_patch16_dinov3", dict(img_size=64)),
        ("eva02_tiny_patch14_224", dict(img_size=56)),
        ("vit_small_patch16_rope_mixed_224", dict(img_size=64)),
        ("vit_base_patch16_rope_reg1_gap_256", dict(img_size=64, qkv_fused=False)),
    ],
)
def test_locatify_keeps_every_weight_and_adds_only_gaug(name, kwargs):
    """Every vanilla tensor (registers, LayerScale, q / v biases, RoPE) is kept; the only new ones
    are GAug's 3·d_h + 3 per block; with GAug's amplitude at zero and no PRR, the output is the
    vanilla model's."""
    torch.manual_seed(0)
    vanilla = timm.create_model(name, num_classes=0, depth=2, embed_dim=64, num_heads=2, **kwargs).double().eval()
    model = locatify(timm.create_model(name, num_classes=0, depth=2, embed_dim=64, num_heads=2, **kwargs).double())
    model.load_state_dict(vanilla.state_dict(), strict=False)
    before, after = vanilla.state_dict(), model.state_dict()
    assert set(after) - set(before) == {
        f"blocks.{i}.attn.gaug.{n}.{t}" for i in range(2) for n in ("log_var", "log_alpha") for t in ("weight", "bias")
    }
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert sum(after[k].numel() for k in set(after) - set(before)) == 2 * (3 * 32 + 3)
    assert isinstance(model.blocks[0].attn, (GAugEvaAttention, GAugAttentionRope))
    size = model.patch_embed.img_size
    images = torch.randn(2, 3, *size, dtype=torch.float64)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.gaug.log_alpha.bias.fill_(-60.0)  # softplus(-60) ≈ 1e-26: no bias
        torch.testing.assert_close(
            locatify(model, prr=False).eval().forward_features(images), vanilla.forward_features(images)
        )


def test_dinov3_entries_are_locatify_of_timm_dinov3():
    """``locatvit_small_patch16_dinov3_qkvb`` = timm's DINOv3 ViT-S/16 (q / v biases, 4 registers)
    with GAug in every block and the class token refined by PRR; a DINOv3 state dict loads with only
    GAug's keys missing."""
    model = timm.create_model("locatvit_small_patch16_dinov3_qkvb", num_classes=0, depth=2)
    vanilla = timm.create_model("vit_small_patch16_dinov3_qkvb", num_classes=0, depth=2)
    assert model.num_prefix_tokens == 5 and model.reg_token.shape == (1, 4, 384)
    assert model.global_pool == "prr" and model.attn_pool.pool == "token"
    assert model.pretrained_cfg["architecture"] == "locatvit_small_patch16_dinov3_qkvb"
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert unexpected == [] and sorted(missing) == sorted(k for k in model.state_dict() if ".gaug." in k)
    assert "blocks.0.attn.q_bias" in model.state_dict()
    assert "blocks.0.attn.q_bias" not in timm.create_model("locatvit_small_patch16_dinov3", depth=1).state_dict()
    with pytest.raises(ValueError, match="no released weights"):
        timm.create_model("locatvit_small_patch16_dinov3", pretrained=True)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("path", ["mask", "flex"])
def test_every_gaug_path_gives_the_separable_numbers(path):
    """The RoPE layer's bias through the materialised mask (training: outputs and gradients) and
    through FlexAttention (its eager CPU form, forward only) equals the fused CPU kernel's."""
    model = locatify(_tiny_dinov3().float(), prr=False)
    attn = model.blocks[1].attn
    model.patch_embed.patch_grid.record((4, 4))
    rope = model.rope.get_embed(shape=[4, 4])
    x = torch.randn(2, 21, 64, generator=torch.Generator().manual_seed(4))

    def run(layer_path: str, train: bool) -> list[torch.Tensor]:
        attn.gaug_path = layer_path
        attn.train(train)
        inp = x.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            out = attn(inp, rope=rope)
        if not train:
            return [out]
        out.square().sum().backward()
        grads = [inp.grad] + [p.grad.clone() for p in attn.parameters()]
        attn.zero_grad()
        return [out, *grads]

    want = run("separable", path == "mask")
    for got, ref in zip(run(path, path == "mask"), want):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_locatify_refuses_other_rope_attention():
    model = _tiny_dinov3()
    model.blocks[1].attn = torch.nn.Identity()
    with pytest.raises(TypeError, match="blocks.1.attn: GAug extends timm's EvaAttention and AttentionRope.*Identity"):
        locatify(model)


def test_registry_entries():
    assert timm.list_models("locatvit_*rope*") == ["locatvit_base_rope_mixed", "locatvit_tiny_rope_mixed"]
    assert timm.list_models("locatvit_*dinov3*") == sorted(
        f"locatvit_{s}_patch16_dinov3{b}" for s in ("small", "small_plus", "base", "large") for b in ("", "_qkvb")
    )
    with torch.device("meta"):
        base = timm.create_model("locatvit_base_rope_mixed")
    assert (base.embed_dim, len(base.blocks), base.blocks[0].attn.num_heads) == (768, 12, 12)
    assert isinstance(base.blocks[0].attn, GAugAttentionRope) and base.pos_embed is None and base.rope_mixed
