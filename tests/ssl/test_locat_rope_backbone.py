"""DINO and iBOT train a LocAt RoPE ViT (``--model.backbone locatvit_tiny_rope_mixed``) and a LocAt
DINOv3 ViT: one step on the tiny geometry (2 blocks, 64 wide, 32 px global / 16 px local crops),
whose gradients reach GAug's parameters in every block of the student and nothing of the teacher."""

import pytest
import torch
from ssl_helpers import TINY_IBOT, TINY_MODEL, LossRecorder, batches_loader, random_batch, tiny_trainer

from locatdino.models.rope import GAugAttentionRope, GAugEvaAttention
from locatdino.ssl import DINOModule, IBOTModule


@pytest.mark.parametrize(
    "objective, backbone",
    [
        ("dino", "locatvit_tiny_rope_mixed"),
        ("ibot", "locatvit_tiny_rope_mixed"),
        ("dino", "locatvit_small_patch16_dinov3_qkvb"),
    ],
)
def test_one_step_trains_gaug_in_every_rope_block(objective, backbone):
    torch.manual_seed(0)
    if objective == "dino":
        module = DINOModule(**{**TINY_MODEL, "backbone": backbone, "batch_size": 4, "warmup_epochs": 0.0})
    else:
        module = IBOTModule(
            **{**TINY_IBOT, "backbone": backbone, "batch_size": 4, "patch_out_dim": 96, "warmup_epochs": 0.0}
        )
    student, teacher = module.student["backbone"], module.teacher["backbone"]
    assert all(isinstance(b.attn, (GAugAttentionRope, GAugEvaAttention)) for b in student.blocks)
    before = {n: p.detach().clone() for n, p in student.named_parameters() if ".gaug." in n}
    teacher_before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    assert len(before) == 2 * 4
    losses = LossRecorder()
    tiny_trainer(max_steps=1, callbacks=[losses]).fit(module, batches_loader([random_batch()]))
    assert len(losses.losses) == 1 and torch.isfinite(torch.tensor(losses.losses)).all()
    after = dict(student.named_parameters())
    assert [n for n, p in before.items() if torch.equal(p, after[n])] == []  # every GAug linear moved
    # the teacher follows by EMA only (momentum 0.996): within 1 % of the step the student took
    for n, p in teacher.named_parameters():
        if ".gaug." in n:
            step = (after[n] - before[n]).abs().max()
            assert (p - teacher_before[n]).abs().max() <= 0.01 * step + 1e-12
