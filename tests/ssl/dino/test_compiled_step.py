"""A DINO step with compiled LocAtViT backbones equals the eager step (fp32 rounding)."""

import copy

import pytest
import torch
from ssl_helpers import random_batch, tiny_module


def _step(module, batch) -> list[torch.Tensor]:
    """Teacher targets, student forward on both resolutions, DINO loss and its gradients."""
    with torch.no_grad():
        probs = module.dino_loss.teacher_targets(module.forward_branch(module.teacher, [batch["global"]]), 0.04)
    loss = module.dino_loss(module.forward_branch(module.student, [batch["global"], batch["local"]]), probs)
    params = [p for p in module.student.parameters() if p.requires_grad]
    return [loss, probs, *torch.autograd.grad(loss, params)]


@pytest.mark.slow
def test_step_with_compiled_backbones_equals_eager():
    torch.manual_seed(0)
    eager = tiny_module(backbone="locatvit_tiny_patch16_224", drop_path_rate=0.0)
    compiled = copy.deepcopy(eager)
    for branch in (compiled.student, compiled.teacher):
        branch["backbone"].compile(backend="aot_eager", fullgraph=True)  # in place: same state_dict keys
    assert compiled.student.state_dict().keys() == eager.student.state_dict().keys()
    batch = random_batch(batch=3)
    torch._dynamo.reset()
    try:
        got, want = _step(compiled, batch), _step(eager, batch)
    finally:
        torch._dynamo.reset()
    assert len(got) == len(want) > 20
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
