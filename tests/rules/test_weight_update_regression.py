"""WeightUpdateRatio on weights that grow from a small init (issue 43): a regression fitted from
N(0, 0.01²) weights to coefficients of about 5 moves hundreds of times its initial norm while its
loss falls; that is learning. A too-large update counts only where the loss did not fall."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from tests.rules.test_reported_runs import _outputs, _run

TARGET = np.array([[5.0, -4.0, 3.0, 5.5]])


def _growing(losses: list[float], *, seed: int = 0) -> dict[int, dict[str, np.ndarray]]:
    """Saved steps 0, 10, ... of a weight that converges to TARGET from 1 % of a unit norm,
    with the given training losses."""
    rng = np.random.default_rng(seed)
    start = rng.normal(0.0, 0.01, TARGET.shape)
    steps = {}
    for index, loss in enumerate(losses):
        progress = 1 - 0.75**index
        weight = start + (TARGET - start) * progress + rng.normal(0.0, 0.01, TARGET.shape)
        steps[10 * index] = {"Linear_weight": weight, "MSELoss_output_0": np.float32(loss)}
    return steps


def test_weights_growing_into_their_scale_while_the_loss_falls_are_silent(tmp_path):
    losses = [60 * 0.5**index + 0.01 for index in range(12)]
    path = write_run(tmp_path / "run", _growing(losses))
    results = evaluate_rule(path, "WeightUpdateRatio")
    assert first_firing(results) is None
    # the ratio was far above the threshold: only the loss's fall makes it learning
    assert max(result.details.get("max_ratio", 0) for result in results) > 10


def test_the_same_updates_with_a_loss_that_does_not_fall_are_found(tmp_path):
    rng = np.random.default_rng(1)
    losses = list(60 + rng.normal(0, 5, 12))  # a loss that wobbles about where it started
    path = write_run(tmp_path / "run", _growing(losses))
    results = evaluate_rule(path, "WeightUpdateRatio")
    first = first_firing(results)
    assert first is not None and first <= 30
    assert next(r for r in results if r.fired).details["direction"] == "large"


def test_a_rising_loss_or_no_loss_at_all_leaves_the_ratio_judged_alone(tmp_path):
    rising = write_run(tmp_path / "rising", _growing([1.0 * 2**index for index in range(12)]))
    assert first_firing(evaluate_rule(rising, "WeightUpdateRatio")) is not None
    no_loss = {step: {"Linear_weight": values["Linear_weight"]} for step, values in _growing([0.0] * 12).items()}
    alone = write_run(tmp_path / "alone", no_loss)
    assert first_firing(evaluate_rule(alone, "WeightUpdateRatio")) is not None


def test_a_non_finite_update_is_found_whatever_the_loss(tmp_path):
    steps = _growing([60 * 0.5**index for index in range(6)])
    steps[50]["Linear_weight"] = np.full(TARGET.shape, np.inf)
    results = evaluate_rule(write_run(tmp_path / "run", steps), "WeightUpdateRatio")
    fired = next(r for r in results if r.fired)
    assert fired.step == 50 and fired.certain


def test_sagemaker_semantics_are_unchanged(tmp_path):
    path = write_run(tmp_path / "run", _growing([60 * 0.5**index for index in range(12)]))
    assert first_firing(evaluate_rule(path, "WeightUpdateRatio:semantics=sagemaker")) == 10


def _learning_findings(out: Path) -> dict[str, list]:
    return {name: [f for f in doc["findings"] if not f.get("advice")] for name, doc in _outputs(out).items()}


@pytest.mark.slow
def test_polynomial_regression_from_a_small_init_is_silent_and_its_lr_1e4_twin_is_found(tmp_path):
    healthy = _run(tmp_path / "healthy", "../weight_update_scripts/polynomial.py")
    assert healthy.returncode == 0, healthy.stdout[-3000:] + healthy.stderr[-3000:]
    findings = _learning_findings(tmp_path / "healthy")
    assert not any(findings.values()), {name: f[:1] for name, f in findings.items() if f}
    assert _outputs(tmp_path / "healthy")["WeightUpdateRatio"]["status"] == "NoIssuesFound"
    faulty = _run(tmp_path / "lr100", "../weight_update_scripts/polynomial.py", "--lr", "100")
    findings = _learning_findings(tmp_path / "lr100")
    assert findings["WeightUpdateRatio"], faulty.stdout[-3000:]
    assert findings["WeightUpdateRatio"][0]["details"]["direction"] == "large"
    diagnosis = json.loads((tmp_path / "lr100" / "rule-output" / "WeightUpdateRatio.json").read_text())["diagnosis"]
    assert diagnosis["primary"] and diagnosis["primary"][0]["rule"] == "WeightUpdateRatio"


def _frozen_from(first_moving: int, interval: int, saved: int = 8) -> dict[int, dict[str, np.ndarray]]:
    """Saved steps 0, interval, ... of a weight that is bit for bit unchanged until step
    ``first_moving`` and moves by 1 % of its norm per saved step after it."""
    rng = np.random.default_rng(3)
    weight = rng.normal(0.0, 1.0, (4, 4)).astype(np.float32)
    steps = {}
    for index in range(saved):
        step = index * interval
        if step >= first_moving:
            weight = weight + np.float32(0.01) * rng.normal(0.0, 0.25, weight.shape).astype(np.float32)
        steps[step] = {"Linear_weight": weight.copy()}
    return steps


def _write(path: Path, steps: dict[int, dict[str, np.ndarray]]) -> str:
    return write_run(path, steps, mode_steps={step: step for step in steps})  # every step a TRAIN step


def test_an_exactly_unchanged_weight_over_two_evaluations_is_found_without_waiting_for_most_of_the_window(
    tmp_path,
):
    # learning rate 0 saved every 5 steps: two evaluations (steps 5 and 10, 10 training steps
    # unchanged) suffice, where a small nonzero ratio waits for 3 of the window's 5
    frozen = first_firing(evaluate_rule(_write(tmp_path / "frozen", _frozen_from(10**9, 5)), "WeightUpdateRatio"))
    assert frozen == 10
    # saved every step: two evaluations span 2 training steps only, fewer than a loss scaler's
    # skipped steps or a warm-up from 0 can leave unchanged; most of the window is still needed
    every = first_firing(evaluate_rule(_write(tmp_path / "every", _frozen_from(10**9, 1)), "WeightUpdateRatio"))
    assert every == 3


def test_a_weight_unchanged_for_its_first_steps_only_is_not_found(tmp_path):
    # a warm-up from 0 or skipped loss-scaler steps leave the first steps' weights as they were
    for first_moving, interval in ((1, 1), (2, 1), (5, 5)):
        run = _write(tmp_path / f"run-{first_moving}-{interval}", _frozen_from(first_moving, interval, saved=12))
        assert first_firing(evaluate_rule(run, "WeightUpdateRatio")) is None, (first_moving, interval)
