"""Two finite explosions the NaN checks miss, on synthetic runs with numpy oracles:

* ExplodingTensor (calibrated): gradients that grow like a running sum while the loss does not
  fall, what a missing ``optimizer.zero_grad()`` leaves in ``.grad`` (g_t = f_0 + ... + f_t);
  fresh mini-batch gradients, and aligned growing gradients while the loss falls, stay silent;
* LossNotDecreasing (calibrated): a cross-entropy loss of 10^7 that falls but stays far above
  what a uniform guess scores (log C summed over the batch), which neither its window comparison
  nor its start check sees; a healthy loss, mean- or sum-reduced, stays silent.
"""

from __future__ import annotations

import math

import numpy as np

from tests.rules.synthetic import evaluate_rule, write_run
from trainguard.rules.diagnosis import diagnose

LOSS = "CrossEntropyLoss_output_0"
SCORES = "CrossEntropyLoss_input_0"
TARGETS = "CrossEntropyLoss_input_1"
SHAPES = {"gradient/net.0.weight": (16, 8), "gradient/net.2.weight": (4, 16)}


def fired(results):
    return [result for result in results if result.fired]


def _gradient_run(path, steps, *, accumulate, loss, growth=1.0, seed=0):
    """Fresh gradients f_t = a shared direction + batch noise (cosine about 0.5 between batches);
    ``accumulate``: the saved gradient is their running sum; ``growth``: fresh ones scale by it per step."""
    rng = np.random.default_rng(seed)
    direction = {name: rng.normal(size=shape) for name, shape in SHAPES.items()}
    total = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    run = {}
    for step in range(steps):
        fresh = {name: (direction[name] + rng.normal(size=shape)) * growth**step * 1e-2
                 for name, shape in SHAPES.items()}  # fmt: skip
        for name in SHAPES:
            total[name] = total[name] + fresh[name] if accumulate else fresh[name]
        run[step] = {**{name: value.astype(np.float32) for name, value in total.items()},
                     LOSS: np.float32(loss(step, rng))}  # fmt: skip
    return write_run(path, run)


def _rising(step, rng):
    return 1.4 + 0.02 * step + 0.05 * rng.normal()


def test_a_running_sum_of_gradients_fires_and_becomes_certain(tmp_path):
    path = _gradient_run(tmp_path / "run", 30, accumulate=True, loss=_rising)
    results = fired(evaluate_rule(path, "ExplodingTensor"))
    assert results, "the accumulating gradients were not reported"
    first = results[0]
    # oracle: the first step whose total norm is 10x step 0's, with 5 saved steps after step 0 behind it
    norms = []
    rng = np.random.default_rng(0)
    direction = {name: rng.normal(size=shape) for name, shape in SHAPES.items()}
    total = {name: np.zeros(shape) for name, shape in SHAPES.items()}
    for step in range(30):
        for name, shape in SHAPES.items():
            total[name] = total[name] + (direction[name] + rng.normal(size=shape)) * 1e-2
        norms.append(math.sqrt(sum(float(np.sum(value.astype(np.float32).astype(np.float64) ** 2))
                                   for value in total.values())))  # fmt: skip
        _rising(step, rng)
    expected = next(step for step in range(5, 30) if norms[step] >= 10 * norms[0])
    assert first.step == expected
    assert not first.certain and "zero_grad" in first.message and "running sum" in first.message
    assert any(result.certain for result in results)
    certain = next(result for result in results if result.certain)
    assert certain.step == expected + 4  # held at 5 consecutive evaluated steps
    assert "zero_grad" in certain.fix_hint


def test_fresh_gradients_and_a_falling_loss_stay_silent(tmp_path):
    fresh = _gradient_run(tmp_path / "fresh", 30, accumulate=False, loss=_rising)
    assert fired(evaluate_rule(fresh, "ExplodingTensor")) == []
    # aligned gradients growing 1.3x a step (a plateau being left) while the loss falls: learning
    leaving = _gradient_run(tmp_path / "leaving", 30, accumulate=True, growth=1.1,
                            loss=lambda step, rng: 1.4 * 0.9**step)  # fmt: skip
    assert fired(evaluate_rule(leaving, "ExplodingTensor")) == []


def test_sagemaker_semantics_judge_non_finite_values_only(tmp_path):
    path = _gradient_run(tmp_path / "run", 30, accumulate=True, loss=_rising)
    assert fired(evaluate_rule(path, "ExplodingTensor:semantics=sagemaker")) == []


def test_growing_gradients_explain_the_dead_relus_they_cause():
    """The ranking: the growth finding (uncertain, step 14) is a cause of the certain dead ReLUs
    (step 33), so it is the primary finding and the stop names it."""
    results = [
        {"rule": "ExplodingTensor", "findings": [
            {"step": 14, "message": "the gradients grow like a running sum: ...", "certain": False}]},
        {"rule": "DeadRelu", "findings": [
            {"step": 31, "message": "100% of the ReLUs are dead", "certain": False},
            {"step": 33, "message": "100% of the ReLUs are dead", "certain": True}]},
        {"rule": "LossNotDecreasing", "findings": [{"step": 25, "message": "loss rose", "certain": False}]},
    ]  # fmt: skip
    diagnosis = diagnose(results)
    assert [finding["rule"] for finding in diagnosis["primary"]] == ["ExplodingTensor"]
    assert {finding["rule"] for finding in diagnosis["consequences"]} == {"DeadRelu", "LossNotDecreasing"}


# -- LossNotDecreasing: far above chance ------------------------------------------------------------


def _loss_run(path, losses, *, scores=True, batch=32, classes=4):
    rng = np.random.default_rng(1)
    run = {}
    for step, value in enumerate(losses):
        tensors = {LOSS: np.float32(value)}
        if scores:
            tensors[SCORES] = rng.normal(size=(batch, classes)).astype(np.float32)
            tensors[TARGETS] = rng.integers(0, classes, size=batch)
        run[step] = tensors
    collections = {"predictions": [SCORES], "labels": [TARGETS]} if scores else {}
    return write_run(path, run, collections=collections)


def _exploded(steps=60, seed=2):
    """A loss of 1.8e8 falling 3 % a step with 10 % noise: still about 3e7 at the end."""
    rng = np.random.default_rng(seed)
    return [1.8e8 * 0.97**step * (1 + 0.1 * rng.normal()) for step in range(steps)]


def test_a_loss_far_above_chance_is_certain_even_while_it_falls(tmp_path):
    path = _loss_run(tmp_path / "run", _exploded())
    results = fired(evaluate_rule(path, "LossNotDecreasing"))
    assert results and results[0].certain
    assert "far above chance" in results[0].message and "log 4" in results[0].message
    # oracle: evaluated every num_steps (10) once 2 x window (16) losses are saved, from step 15; the start
    # check needs more than 16, so its first verdict is at step 25
    assert results[0].step == 25
    assert "initialisation" in results[0].fix_hint
    # without the cross-entropy's scores the chance level is unknown: the falling loss is not reported
    blind = _loss_run(tmp_path / "blind", _exploded(), scores=False)
    assert not any(result.certain for result in fired(evaluate_rule(blind, "LossNotDecreasing")))


def test_healthy_cross_entropy_losses_stay_silent(tmp_path):
    rng = np.random.default_rng(3)
    mean_loss = [math.log(4) * 0.97**step + 0.05 * abs(rng.normal()) for step in range(60)]
    assert fired(evaluate_rule(_loss_run(tmp_path / "mean", mean_loss), "LossNotDecreasing")) == []
    # reduction="sum" over a batch of 32: 44 at the start, falling
    summed = [32 * value for value in mean_loss]
    assert fired(evaluate_rule(_loss_run(tmp_path / "sum", summed), "LossNotDecreasing")) == []
    # a shuffled-label run sits at chance: not far above it (the plateau verdict is a separate finding)
    flat = [math.log(4) + 0.02 * rng.normal() for _ in range(60)]
    results = fired(evaluate_rule(_loss_run(tmp_path / "flat", flat), "LossNotDecreasing"))
    assert not any("chance" in result.message for result in results)
