import copy

import pytest
import torch

from locatdino.ssl import update_teacher


def test_ema_matches_formula_for_every_parameter():
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.data.normal_()
    before = [p.clone() for p in teacher.parameters()]
    update_teacher(student.parameters(), teacher.parameters(), 0.9)
    for t0, t, s in zip(before, teacher.parameters(), student.parameters()):
        torch.testing.assert_close(t, 0.9 * t0 + 0.1 * s)


def test_momentum_one_keeps_teacher_bitwise():
    a, b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    before = [p.clone() for p in b.parameters()]
    update_teacher(a.parameters(), b.parameters(), 1.0)
    assert all(torch.equal(x, y) for x, y in zip(before, b.parameters()))


def test_mismatched_lists_are_refused():
    with pytest.raises(ValueError, match="2 student vs 1 teacher"):
        update_teacher([torch.zeros(1), torch.zeros(1)], [torch.zeros(1)], 0.5)
