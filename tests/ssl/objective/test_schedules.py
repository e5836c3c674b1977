import math

import numpy as np
import pytest

from locatdino.ssl import DINOSchedules, cosine_schedule, scaled_lr, warmup_constant_schedule


def test_cosine_with_warmup_values():
    s = cosine_schedule(1.0, 0.0, total_steps=30, warmup_steps=10)
    assert len(s) == 30
    np.testing.assert_allclose(s[:10], np.linspace(0, 1, 10))
    assert s[10] == 1.0
    # step 10 + i of the 20 cosine steps: ½(1 + cos(π i / 20))
    assert s[20] == pytest.approx(0.5 * (1 + math.cos(math.pi * 10 / 20)))
    assert s[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 19 / 20)))


def test_warmup_longer_than_run_is_cut_not_compressed():
    np.testing.assert_allclose(cosine_schedule(1.0, 0.0, total_steps=3, warmup_steps=10), [0, 1 / 9, 2 / 9])
    np.testing.assert_allclose(warmup_constant_schedule(0.0, 1.0, total_steps=2, warmup_steps=5), [0, 0.25])


def test_teacher_temperature_warmup_then_constant():
    s = warmup_constant_schedule(0.04, 0.07, total_steps=10, warmup_steps=4)
    np.testing.assert_allclose(s, [0.04, 0.05, 0.06, 0.07] + [0.07] * 6)


def test_dino_schedules_at_chosen_steps():
    s = DINOSchedules.build(
        total_steps=1000,
        steps_per_epoch=100,
        global_batch=512,
        base_lr=5e-4,
        min_lr=1e-6,
        warmup_epochs=2,
        weight_decay=0.04,
        weight_decay_end=0.4,
        momentum_teacher=0.996,
        momentum_teacher_end=1.0,
        teacher_temp=0.07,
        warmup_teacher_temp=0.04,
        warmup_teacher_temp_epochs=3,
    )
    peak = 5e-4 * 512 / 256
    assert scaled_lr(5e-4, 512) == peak
    assert s.at(0) == pytest.approx({"lr": 0.0, "weight_decay": 0.04, "teacher_momentum": 0.996, "teacher_temp": 0.04})
    assert s.at(199)["lr"] == pytest.approx(peak) and s.at(200)["lr"] == pytest.approx(peak)
    assert s.at(100)["lr"] == pytest.approx(peak * 100 / 199)
    half = 0.5 * (1 + math.cos(math.pi * 500 / 1000))
    assert s.at(500)["weight_decay"] == pytest.approx(0.4 + (0.04 - 0.4) * half)
    assert s.at(500)["teacher_momentum"] == pytest.approx(1.0 + (0.996 - 1.0) * half)
    assert s.at(150)["teacher_temp"] == pytest.approx(0.04 + 0.03 * 150 / 299)
    assert s.at(300)["teacher_temp"] == pytest.approx(0.07)
    assert s.at(5000) == s.at(999)  # past the end: last value


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="total_steps"):
        DINOSchedules.build(
            total_steps=0,
            steps_per_epoch=1,
            global_batch=1,
            base_lr=1,
            min_lr=0,
            warmup_epochs=0,
            weight_decay=0,
            weight_decay_end=0,
            momentum_teacher=0,
            momentum_teacher_end=0,
            teacher_temp=0,
            warmup_teacher_temp=0,
            warmup_teacher_temp_epochs=0,
        )
