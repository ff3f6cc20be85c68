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

import trainguard.pytorch as tg  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

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


def _train(out, *, lr, zero_grad_late=False, steps=80, seed=0):
    """A 4-class MLP on separable blobs, SGD, every step saved (as the corpus' MLP cases)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(4, 16)) * 2
    y = rng.integers(0, 4, size=steps * 32)
    X = torch.tensor(centers[y] + rng.normal(size=(y.size, 16)), dtype=torch.float32)
    y = torch.tensor(y)
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)]
    model = torch.nn.Sequential(*layers)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(tg.modes.TRAIN)
    for step in range(steps):
        optimizer.zero_grad()
        criterion(model(X[step * 32:(step + 1) * 32]), y[step * 32:(step + 1) * 32]).backward()
        if zero_grad_late:  # a silent bug: the gradients are cleared before the update
            optimizer.zero_grad()
        optimizer.step()
    hook.close()
    return create_trial(out)


def test_real_runs_that_do_not_learn_are_reported_while_training_and_a_healthy_one_is_not(tmp_path):
    healthy = _train(str(tmp_path / "healthy"), lr=0.1)
    assert first_firing(evaluate_rule(healthy, "LossNotDecreasing")) is None
    for name, options in {"tiny-lr": {"lr": 1e-6}, "zero-grad-after-backward": {"lr": 0.1, "zero_grad_late": True}}.items():
        trial = _train(str(tmp_path / name), **options)
        step = first_firing(evaluate_rule(trial, "LossNotDecreasing", finish=False))
        assert step is not None and step < 40, (name, step)  # the run ends at step 79
