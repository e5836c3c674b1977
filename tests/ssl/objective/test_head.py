import pytest
import torch

from locatdino.ssl import DINOHead


def test_reference_shapes_and_parameter_names():
    head = DINOHead(384, out_dim=1000)
    linears = [m for m in head.mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(384, 2048), (2048, 2048), (2048, 256)]
    assert sum(isinstance(m, torch.nn.GELU) for m in head.mlp) == 2
    names = dict(head.named_parameters())
    assert names["last_layer.parametrizations.weight.original0"].shape == (1000, 1)
    assert names["last_layer.parametrizations.weight.original1"].shape == (1000, 256)
    assert head(torch.randn(3, 384)).shape == (3, 1000)


@pytest.mark.parametrize("norm_last_layer", [True, False])
def test_weight_norm_gain_is_one_and_frozen_when_norm_last_layer(norm_last_layer):
    head = DINOHead(16, out_dim=32, hidden_dim=24, bottleneck_dim=8, norm_last_layer=norm_last_layer)
    gain = head.last_layer.parametrizations.weight.original0
    assert torch.equal(gain, torch.ones(32, 1))
    assert gain.requires_grad is (not norm_last_layer)
    # every row of the effective weight has unit norm at start
    torch.testing.assert_close(head.last_layer.weight.norm(dim=1), torch.ones(32))


def test_output_is_last_layer_of_l2_normalised_bottleneck():
    torch.manual_seed(0)
    head = DINOHead(16, out_dim=32, hidden_dim=24, bottleneck_dim=8, nlayers=2, use_bn=True)
    assert [type(m).__name__ for m in head.mlp] == ["Linear", "BatchNorm1d", "GELU", "Linear"]
    x = torch.randn(5, 16)
    z = head.mlp(x)
    want = (z / z.norm(dim=-1, keepdim=True)) @ head.last_layer.weight.T
    torch.testing.assert_close(head(x), want)


def test_one_layer_head_and_bad_depth():
    assert [type(m).__name__ for m in DINOHead(16, 32, nlayers=1, bottleneck_dim=8).mlp] == ["Linear"]
    with pytest.raises(ValueError, match="nlayers"):
        DINOHead(16, 32, nlayers=0)
