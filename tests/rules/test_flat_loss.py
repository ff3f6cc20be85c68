"""LossNotDecreasing's "not learning" verdict while training: a loss that has gone nowhere for
three windows and shows no falling trend is reported then, not only when training ended (the
detection corpus' lr-tiny, no-update and softmax-before-CrossEntropyLoss runs were reported at
their last step, 10+ save intervals after they were plainly flat). A run leaving a plateau (its
last losses falling) and a healthy run stay silent.

Each firing here is checked with ``finish=False`` (the rule's results while training): without the
check the rule says nothing until ``finish()``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run

torch = pytest.importorskip("torch")

from tests.rules.test_loss_rules_pytorch import _loop  # noqa: E402

LOSS = "CrossEntropyLoss_output_0"


def _run(tmp_path, name, losses):
    steps = {step: {LOSS: np.float32(value)} for step, value in enumerate(losses)}
    return write_run(tmp_path / name, steps, collections={"losses": [LOSS]})


def test_a_flat_loss_is_reported_while_training_and_a_loss_leaving_its_plateau_is_not(tmp_path):
    rng = np.random.default_rng(3)
    flat = np.log(4) + rng.normal(0, 0.01, 80)
    results = evaluate_rule(_run(tmp_path, "flat", flat), "LossNotDecreasing", finish=False)
    fired = [result for result in results if result.fired]
    assert fired and fired[0].step == 25, [r.step for r in fired][:3]  # 3 windows of 8, evaluated every 10
    assert not fired[0].certain and "not learning" in fired[0].message
    assert fired[0].details["losses"][LOSS]["kind"] == "plateau"
    # flat for 16 steps, then falling slowly (a CNN's slow start): the trend holds the verdict back
    slow = np.r_[np.full(16, np.log(4)), np.log(4) - 0.006 * np.arange(1, 65)] + rng.normal(0, 0.01, 80)
    assert first_firing(evaluate_rule(_run(tmp_path, "slow", slow), "LossNotDecreasing")) is None


def test_real_runs_that_do_not_learn_are_reported_while_training_and_a_healthy_one_is_not(tmp_path):
    # the plain SGD loop of test_loss_rules_pytorch: 80 steps of 32, every step saved
    healthy = _loop(str(tmp_path / "healthy"), lr=0.1, steps=80, batch=32)
    assert first_firing(evaluate_rule(healthy, "LossNotDecreasing")) is None
    for name, lr in {"tiny-lr": 1e-6, "lr-zero": 0.0}.items():
        trial = _loop(str(tmp_path / name), lr=lr, steps=80, batch=32)
        step = first_firing(evaluate_rule(trial, "LossNotDecreasing", finish=False))
        assert step is not None and step < 40, (name, step)  # the run ends at step 79
