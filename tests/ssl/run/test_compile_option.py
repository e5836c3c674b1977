"""``model.compile``: a `fit` with compiled backbones (inductor, the GAug CPU kernel inside) has
eager's losses to fp32 rounding, and its checkpoints resume eager and the other way round."""

import pytest
import torch
from ssl_helpers import random_batch, resumed_losses, tiny_module

from locatdino.ssl import export_backbone

pytestmark = pytest.mark.slow  # inductor builds its C++ kernels (~60 s on 2 cores with a cold cache)


def _builder(compiled_calls: tuple[bool, ...]):
    """``build()`` for :func:`resumed_losses`: its n-th module compiled as ``compiled_calls[n]``."""
    calls = iter(compiled_calls)

    def build():
        torch._dynamo.reset()  # each run compiles its own backbones
        # drop path off: RNG streams are not part of a checkpoint (test_resume_continues_exactly)
        return tiny_module(backbone="locatvit_tiny_patch16_224", drop_path_rate=0.0, lr=5e-2, compile=next(calls))

    return build


def test_compiled_fit_matches_eager_and_resumes_across_both(tmp_path):
    batch = random_batch(seed=3)
    try:
        # uninterrupted eager run; first half compiled; second half eager from the compiled checkpoint
        whole, first, second, _ = resumed_losses(tmp_path / "a", _builder((False, True, False)), batch)
        saved = torch.load(tmp_path / "a" / "last.ckpt", weights_only=False)
        # and the other way: an eager checkpoint resumed compiled
        whole_b, first_b, second_b, _ = resumed_losses(tmp_path / "b", _builder((False, False, True)), batch)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # of the last run (reset at its start)
        breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    finally:
        torch._dynamo.reset()
    assert len(whole) == 6 and len(first) == 3 and len(second) == 3
    torch.testing.assert_close(first + second, whole, rtol=1e-5, atol=0)
    torch.testing.assert_close(first_b + second_b, whole_b, rtol=1e-5, atol=0)
    assert whole[-1] != whole[0]  # the steps train: a stuck run would match trivially
    assert graphs >= 3 and breaks == 0  # teacher, student at 2 crop sizes: each one whole graph
    assert not [k for k in saved["state_dict"] if "_orig_mod" in k]
    out = tmp_path / "backbone.pth"
    export_backbone(tmp_path / "a" / "last.ckpt", out)
    assert not [k for k in torch.load(out, weights_only=True) if "_orig_mod" in k]
