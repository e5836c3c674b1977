"""GramLoss against DINOv3's formula written out with loops in fp64 (dinov3/loss/gram_loss.py)."""

import itertools
import math

import pytest
import torch

from locatdino.ssl import GramLoss


def naive_gram_loss(
    student, teacher, apply_norm, img_level, remove_neg, remove_only_teacher_neg, masks=None, keep=None
):
    """Entry by entry in fp64: the reference's steps in its order (teacher normalised first; with
    remove_only_teacher_neg the teacher's negatives are zeroed, then the student is masked where
    both are negative, which by then is nowhere)."""
    s, t = student.double(), teacher.double()
    if keep is not None:
        sel = masks if keep == "masked" else ~masks
        s, t = s[sel], t[sel]
    if apply_norm:
        t = t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        s = s / s.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    groups = (
        [(s[b], t[b]) for b in range(s.shape[0])]
        if img_level
        else [(s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1]))]
    )
    total, count = 0.0, 0
    for xs, xt in groups:
        n = xs.shape[0]
        for i in range(n):
            for j in range(n):
                gs = sum(float(xs[i, d] * xs[j, d]) for d in range(xs.shape[1]))
                gt = sum(float(xt[i, d] * xt[j, d]) for d in range(xt.shape[1]))
                if remove_neg:
                    gs, gt = max(gs, 0.0), max(gt, 0.0)
                elif remove_only_teacher_neg:
                    gt = max(gt, 0.0)
                    if gs < 0 and gt < 0:  # the reference's second line: gt >= 0 here, never true
                        gs = 0.0
                total += (gs - gt) ** 2
                count += 1
    return total / count


def _feats(seed, shape=(3, 5, 4)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


OPTIONS = [
    (norm, img, neg, only)
    for norm, img, (neg, only) in itertools.product(
        [True, False], [True, False], [(False, False), (True, False), (False, True)]
    )
]


@pytest.mark.parametrize("apply_norm, img_level, remove_neg, remove_only_teacher_neg", OPTIONS)
def test_every_option_matches_the_naive_formula(apply_norm, img_level, remove_neg, remove_only_teacher_neg):
    s, t = _feats(0)
    loss = GramLoss(apply_norm, img_level=True, remove_neg=remove_neg, remove_only_teacher_neg=remove_only_teacher_neg)
    got = loss(s, t, img_level=img_level)
    want = naive_gram_loss(s, t, apply_norm, img_level, remove_neg, remove_only_teacher_neg)
    assert got.dtype == torch.float32
    assert math.isclose(got.item(), want, rel_tol=1e-5), (got.item(), want)  # fp32 vs fp64 sums of 4 products


def test_img_level_defaults_to_the_constructors_and_batch_level_takes_flat_features():
    s, t = _feats(1)
    batch = GramLoss(img_level=False, remove_neg=False)
    want = naive_gram_loss(s, t, True, False, False, False)
    assert math.isclose(batch(s, t).item(), want, rel_tol=1e-5)
    assert math.isclose(batch(s.flatten(0, 1), t.flatten(0, 1)).item(), want, rel_tol=1e-5)
    per_image = GramLoss(remove_neg=False)
    assert not math.isclose(per_image(s, t).item(), want, rel_tol=1e-3)  # the two levels differ here


def test_remove_only_teacher_neg_leaves_every_student_entry_as_the_reference_does():
    """The quirk: the student keeps its negative similarities even where the teacher's are negative
    too, so the loss is that of the clamped teacher against the raw student."""
    s, t = _feats(2)
    loss = GramLoss(remove_neg=False, remove_only_teacher_neg=True)(s, t)
    sn, tn = torch.nn.functional.normalize(s, dim=-1), torch.nn.functional.normalize(t, dim=-1)
    gs, gt = sn @ sn.transpose(1, 2), (tn @ tn.transpose(1, 2)).clamp_min(0)
    both_negative = ((sn @ sn.transpose(1, 2)) < 0) & ((tn @ tn.transpose(1, 2)) < 0)
    assert both_negative.sum() > 0  # the case the reference's mask was meant for exists in this input
    assert torch.allclose(loss, ((gs - gt) ** 2).mean(), rtol=1e-6)
    student_masked = torch.where(both_negative, torch.zeros_like(gs), gs)
    assert not torch.allclose(loss, ((student_masked - gt) ** 2).mean(), rtol=1e-3)


@pytest.mark.parametrize("keep", ["masked", "unmasked"])
def test_masked_or_unmasked_tokens_only(keep):
    s, t = _feats(3)
    masks = torch.zeros(3, 5, dtype=torch.bool)
    masks[0, :2] = masks[2, 3:] = True
    got = GramLoss(img_level=False, remove_neg=True, tokens_used=keep)(s, t, masks=masks)
    assert math.isclose(got.item(), naive_gram_loss(s, t, True, False, True, False, masks, keep), rel_tol=1e-5)


def test_fp32_under_autocast_and_a_gradient_only_for_the_student():
    s, t = _feats(4)
    s.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = GramLoss(remove_neg=False)(s.bfloat16(), t.bfloat16())
    assert got.dtype == torch.float32
    want = naive_gram_loss(s.detach().bfloat16(), t.bfloat16(), True, True, False, False)
    assert math.isclose(got.item(), want, rel_tol=1e-5)
    got.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert GramLoss()(t, t).item() == 0.0  # the same features: nothing to pull


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"remove_neg": True, "remove_only_teacher_neg": True}, "exclusive"),
        ({"tokens_used": "some"}, "tokens_used must be one of"),
        ({"tokens_used": "masked"}, "set img_level false"),
    ],
)
def test_contradicting_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GramLoss(**kwargs)


def test_shapes_and_masks_are_checked():
    s, t = _feats(5)
    with pytest.raises(ValueError, match="differ in shape"):
        GramLoss()(s, t[:, :4])
    with pytest.raises(ValueError, match="needs the masks"):
        GramLoss(img_level=False, tokens_used="masked")(s, t)
    with pytest.raises(ValueError, match=r"needs \[B, N, D\]"):
        GramLoss()(s.flatten(0, 1), t.flatten(0, 1))
