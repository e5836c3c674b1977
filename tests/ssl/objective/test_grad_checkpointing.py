"""``model.grad_checkpointing``: the same step, the same loss and gradients, with the student's
blocks (GAug attention included) recomputed in the backward."""

import pytest
import torch
from ssl_helpers import TINY_MODEL, random_batch

from locatdino.common.errors import UserError
from locatdino.ssl import DINOFSDPStrategy, DINOModule, IBOTModule, SupervisedModule
from locatdino.ssl.objective.fsdp import BLOCK_CHECKPOINTING

HEAD = {k: TINY_MODEL[k] for k in ("out_dim", "hidden_dim", "bottleneck_dim")}
COMMON = {
    "backbone": "locatvit_tiny_patch16_224",
    "backbone_kwargs": TINY_MODEL["backbone_kwargs"],
    "batch_size": 4,
    "drop_path_rate": 0.2,
}  # stochastic depth: the recomputation must replay its draws
VALUES = {"teacher_temp": 0.04, "teacher_patch_temp": 0.07}


def _dino_loss(module, batch):
    return module.step_losses(batch, VALUES).loss


def _supervised_loss(module, batch):
    images = batch["global"].flatten(0, 1)
    return module.criterion(module.classifier(images), torch.arange(images.shape[0]) % 10)


OBJECTIVES = {
    "dino": (lambda **kw: DINOModule(**COMMON, **HEAD, **kw), _dino_loss, "student"),
    "ibot": (lambda **kw: IBOTModule(**COMMON, **HEAD, patch_out_dim=96, **kw), _dino_loss, "student"),
    "supervised": (
        lambda **kw: SupervisedModule(**COMMON, num_classes=10, mixup_alpha=0.0, cutmix_alpha=0.0, **kw),
        _supervised_loss,
        "classifier",
    ),
}


def _loss_and_grads(objective: str, grad_checkpointing: bool):
    """fp64 loss and gradients of one step, and how often the first trained block's GAug attention
    ran (a wrapped ``forward``: module hooks do not fire in a checkpoint's recomputation)."""
    build, loss_fn, trained = OBJECTIVES[objective]
    torch.manual_seed(0)
    module = build(grad_checkpointing=grad_checkpointing).double().train()
    calls = []
    attn = getattr(module, trained).backbone.blocks[0].attn
    forward = attn.forward
    attn.forward = lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs)
    batch = {k: v.double() for k, v in random_batch(batch=4).items()}
    torch.manual_seed(1)
    loss = loss_fn(module, batch)
    loss.backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.requires_grad and p.grad is not None}
    return loss.detach(), grads, len(calls)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_checkpointed_step_has_the_same_loss_and_gradients(objective):
    loss, grads, calls = _loss_and_grads(objective, grad_checkpointing=False)
    loss_ckpt, grads_ckpt, calls_ckpt = _loss_and_grads(objective, grad_checkpointing=True)
    assert calls_ckpt == 2 * calls > 0  # the attention ran again in the backward
    torch.testing.assert_close(loss_ckpt, loss, rtol=1e-12, atol=0)
    assert grads_ckpt.keys() == grads.keys() and len(grads) > 20
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-10, atol=1e-13, msg=name)


def test_only_the_student_is_checkpointed():
    module = DINOModule(**COMMON, **HEAD, grad_checkpointing=True)
    assert module.student["backbone"].grad_checkpointing and not module.teacher["backbone"].grad_checkpointing


def test_under_fsdp_the_strategy_checkpoints_each_block():
    """timm's checkpointing is turned off for the strategy's per-block wrapper (Lightning applies
    the policy when it wraps the model); a plain FSDPStrategy is refused in one line."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import FSDPStrategy

    module = DINOModule(**COMMON, **HEAD, grad_checkpointing=True)
    module._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(UserError, match="model.grad_checkpointing under FSDP needs trainer.strategy dino_fsdp"):
        module.setup("fit")
    strategy = DINOFSDPStrategy()
    module._trainer = SimpleNamespace(strategy=strategy)
    module.setup("fit")
    assert not module.student["backbone"].grad_checkpointing
    assert strategy._activation_checkpointing_kwargs == {}
    strategy.follow_grad_checkpointing(module)  # what its _setup_model does before wrapping
    assert strategy._activation_checkpointing_kwargs == {"auto_wrap_policy": BLOCK_CHECKPOINTING}
    plain = DINOFSDPStrategy()
    plain.follow_grad_checkpointing(DINOModule(**COMMON, **HEAD))
    assert plain._activation_checkpointing_kwargs == {}
