import torch

from locatdino.ssl import clip_grad_per_tensor_


def reference_clip(params, clip):
    """main_dino.py / utils.clip_gradients of the reference, one tensor at a time."""
    norms = []
    for p in params:
        if p.grad is not None:
            norm = p.grad.data.norm(2)
            norms.append(norm.item())
            coef = clip / (norm + 1e-6)
            if coef < 1:
                p.grad.data.mul_(coef)
    return norms


def test_matches_reference_per_tensor_and_leaves_missing_grads():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (3, 50, 7, 400)]
    grads = [torch.randn(3) * 0.1, torch.randn(50) * 10, None, torch.randn(400)]
    for p, g in zip(params, grads):
        p.grad = g
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, g in zip(ref, grads):
        r.grad = None if g is None else g.clone()
    norms = clip_grad_per_tensor_(params, 3.0)
    want_norms = reference_clip(ref, 3.0)
    torch.testing.assert_close(norms[[0, 1, 3]], torch.tensor(want_norms))
    assert norms[2] == 0 and params[2].grad is None
    for p, r in zip(params, ref):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, r.grad)
    # small tensors untouched, big ones clipped to 3 each (not a global norm)
    assert torch.equal(params[0].grad, grads[0])
    assert abs(params[1].grad.norm().item() - 3.0) < 1e-4 and abs(params[3].grad.norm().item() - 3.0) < 1e-4
