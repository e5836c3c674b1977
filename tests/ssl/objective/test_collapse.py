import math
import warnings

import pytest
import torch

from locatdino.ssl import CollapseMonitor, teacher_entropies


def test_entropies_of_uniform_one_hot_and_mixed():
    k = 8
    h, m = teacher_entropies(torch.full((2, 4, k), 1 / k))
    assert h.item() == pytest.approx(math.log(k)) and m.item() == pytest.approx(math.log(k))
    same = torch.zeros(2, 4, k)
    same[..., 3] = 1
    h, m = teacher_entropies(same)
    assert h.item() == pytest.approx(0, abs=1e-6) and m.item() == pytest.approx(0, abs=1e-6)
    diverse = torch.eye(k)[None]  # each image one different prototype: healthy
    h, m = teacher_entropies(diverse)
    assert h.item() == pytest.approx(0, abs=1e-6) and m.item() == pytest.approx(math.log(k))


class _Trainer:
    def __init__(self):
        self.global_step, self.callback_metrics = 0, {}


class _Module:
    out_dim = 100
    entropies_logged_at = None


def _run_monitor(entropy: float, batch_entropy: float, log_every: int) -> list[str]:
    """Checks at steps 1-5 (patience 3); the module logs fresh values every ``log_every`` steps."""
    monitor, trainer, module = CollapseMonitor(patience=3, check_every_n_steps=1), _Trainer(), _Module()
    trainer.callback_metrics = {
        "teacher/entropy": torch.tensor(entropy),
        "teacher/batch_entropy": torch.tensor(batch_entropy),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 6):
            trainer.global_step = step
            if (step - 1) % log_every == 0:
                module.entropies_logged_at = step - 1
            monitor.on_train_batch_end(trainer, module, None, None, 0)
    return [str(w.message) for w in caught]


@pytest.mark.parametrize(
    "entropy,batch_entropy,warns",
    [(math.log(100), math.log(100), "uniform"), (0.0, 0.0, "one prototype"), (0.5, 3.0, None)],
)
def test_warns_after_patience_checks(entropy, batch_entropy, warns):
    messages = _run_monitor(entropy, batch_entropy, log_every=1)
    if warns:
        assert len(messages) == 1 and warns in messages[0] and "step 3" in messages[0]
    else:
        assert messages == []


def test_stale_values_between_logs_are_counted_once():
    """Logged at steps 0 and 3 only, checked at steps 1-5: 2 values, below a patience of 3."""
    assert _run_monitor(0.0, 0.0, log_every=3) == []
    assert len(_run_monitor(0.0, 0.0, log_every=2)) == 1  # logged at 0, 2, 4: the third one warns
