"""LossNotDecreasing, Overfit, Underfitting, Overtraining on synthetic runs written in the real
format: deleted smdebug test vectors, numpy oracles on random runs, SageMaker string parameters,
live runs and NaN losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.rules._loss_synthetic import write_single_mode_run
from tests.rules.synthetic import evaluate_rule, first_firing, open_trial, write_run
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule

# -- LossNotDecreasing: the deleted smdebug vectors -------------------------------------------------

VECTOR_1 = [0.30, 0.33, 0.31, 0.30, 0.28]
VECTOR_2 = [0.30, 0.33, 0.31, 0.30, 0.28, 0.20, 0.42]


def _two_losses(tmp_path, values, collections=None):
    # a hook saving every 4th step: mode steps 0, 4, 8, ... as in smdebug's test
    steps = {4 * i: {"loss_0": value, "loss_1": value} for i, value in enumerate(values)}
    return write_single_mode_run(tmp_path / "run", steps, collections=collections)


@pytest.mark.parametrize(
    "spec",
    [
        RuleSpec("LossNotDecreasing", {"semantics": "sagemaker"}),  # defaults: the losses collection
        RuleSpec("LossNotDecreasing", {"tensor_regex": "loss_0,loss_1", "use_losses_collection": "False",
                                       "semantics": "sagemaker"}),
        RuleSpec("LossNotDecreasing", {"collection_names": "default", "use_losses_collection": "False",
                                       "semantics": "sagemaker"}),
        # the earlier documented default
        RuleSpec("LossNotDecreasing", {"diff_percent": "0", "semantics": "sagemaker"}),
    ],
    ids=["losses-collection", "tensor_regex", "collection_names", "diff_percent-0"],
)
def test_loss_not_decreasing_vector_1_fires_at_step_12(tmp_path, spec):
    run = _two_losses(tmp_path, VECTOR_1, collections={"losses": ["loss_0", "loss_1"], "default": ["loss_0", "loss_1"]})
    results = evaluate_rule(run, spec)
    assert first_firing(results) == 12  # 0.30 at 12 did not decrease from 0.30 at step 0
    fired = next(result for result in results if result.fired)
    assert set(fired.details["losses"]) == {"loss_0", "loss_1"}
    # invoked from 13 to 17 (a fresh rule): step 16 compares 0.28 with 0.33 at step 4
    assert first_firing(evaluate_rule(run, spec, start=13, end=17)) is None


def test_loss_not_decreasing_vector_2_documented_semantic_and_deleted_test_semantic(tmp_path):
    run = _two_losses(tmp_path, VECTOR_2, collections={"losses": ["loss_0", "loss_1"]})
    # trainguard's (documented) reading of diff_percent=20: the loss must fall by 20 % over
    # num_steps; at step 12 it is 0.30 against 0.30 at step 0, so the rule fires there.
    assert first_firing(evaluate_rule(run, "LossNotDecreasing:diff_percent=20,semantics=sagemaker")) == 12
    # The deleted smdebug test expected step 24 (0.42 vs 0.30 at step 12): "fire if the loss rose
    # by 20 %". In trainguard that reading is a negative diff_percent (a tolerated rise).
    results = evaluate_rule(run, "LossNotDecreasing:diff_percent=-20,semantics=sagemaker")
    assert first_firing(results) == 24
    fired = next(result for result in results if result.fired)
    assert fired.details["losses"]["loss_0"]["kind"] == "diverging"
    assert "learning rate" in fired.fix_hint


# -- LossNotDecreasing: numpy oracle on random runs -------------------------------------------------


def _lnd_oracle(steps: list[int], values: list[float], num_steps: int, diff_percent: float) -> int | None:
    last = None
    for index, step in enumerate(steps):
        if last is not None and step < last + num_steps:
            continue
        earlier = [j for j in range(index) if steps[j] <= step - num_steps]
        if not earlier:
            continue
        previous = values[earlier[-1]]
        last = step
        if not math.isfinite(previous):
            continue
        value = values[index]
        if not math.isfinite(value):
            return step
        decrease = 100 * (previous - value) / abs(previous)
        if (decrease <= 0) if diff_percent == 0 else (decrease < diff_percent):
            return step
    return None


@pytest.mark.parametrize("seed", range(8))
def test_loss_not_decreasing_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    interval = int(rng.integers(1, 5))
    steps = list(range(0, interval * int(rng.integers(8, 30)), interval))
    trend = np.linspace(2.0, float(rng.uniform(0.2, 2.5)), len(steps))
    values = (trend * (1 + rng.normal(0, 0.03, len(steps)))).tolist()
    num_steps = int(rng.integers(2, 12))
    diff_percent = float(rng.choice([0.0, 0.1, 1.0, 5.0, -5.0]))
    losses = dict(zip(steps, ({"CrossEntropyLoss_output_0": v} for v in values), strict=True))
    run = write_single_mode_run(tmp_path / "run", losses)
    spec = RuleSpec("LossNotDecreasing", {"num_steps": str(num_steps), "diff_percent": str(diff_percent),
                                          "semantics": "sagemaker"})
    assert first_firing(evaluate_rule(run, spec)) == _lnd_oracle(steps, values, num_steps, diff_percent)


def test_loss_not_decreasing_nan_loss_fires_as_diverging_and_never_crashes(tmp_path):
    values = [2.0, 1.8, 1.6, float("nan"), float("nan"), 1.0, 0.9]
    run = write_run(tmp_path / "run", {s: {"loss_backward_output_0": v} for s, v in enumerate(values)})
    results = evaluate_rule(run, "LossNotDecreasing:num_steps=1,semantics=sagemaker")
    assert first_firing(results) == 3
    assert results[2].details["losses"]["loss_backward_output_0"]["kind"] == "diverging"
    # step 4 compares with NaN at step 3 (skipped), step 5 too: nothing raised, no result there
    assert [r.step for r in results] == [1, 2, 3, 6]


def test_loss_not_decreasing_prefers_eval_losses_and_counts_mode_steps(tmp_path):
    # TRAIN loss falls every step; EVAL loss (one step per validation pass) is flat
    steps, modes = {}, {}
    step = 0
    for epoch in range(6):
        for batch in range(5):
            steps[step] = {"CrossEntropyLoss_output_0": 2.0 - 0.05 * (epoch * 5 + batch)}
            modes[step] = "TRAIN"
            step += 1
        steps[step] = {"CrossEntropyLoss_output_0": 1.0}
        modes[step] = "EVAL"
        step += 1
    run = write_run(tmp_path / "run", steps, modes=modes)
    trial = open_trial(run)
    results = evaluate_rule(trial, "LossNotDecreasing:num_steps=2,semantics=sagemaker")
    assert all(result.details["mode"] == "EVAL" for result in results)
    # EVAL mode steps 0..5; first comparison at EVAL step 2 (vs step 0): flat → fires
    assert first_firing(results) == trial.global_step("EVAL", 2)
    train = evaluate_rule(trial, "LossNotDecreasing:num_steps=2,mode=TRAIN,semantics=sagemaker")
    assert train and first_firing(train) is None


def test_loss_not_decreasing_live_run_and_missing_losses(tmp_path):
    live = write_run(tmp_path / "live", {s: {"CrossEntropyLoss_output_0": 1.0} for s in range(5)}, finished=False)
    rule = create_rule(open_trial(live), "LossNotDecreasing:num_steps=2,semantics=sagemaker")
    assert rule.evaluate(99) is None  # a step that does not exist yet: skipped, not an error
    assert [rule.evaluate(step) for step in range(2)] == [None, None]
    assert rule.evaluate(2).fired
    no_losses = write_run(tmp_path / "none", {0: {"fc.weight": np.ones(3)}, 1: {"fc.weight": np.ones(3)}})
    for semantics in ("calibrated", "sagemaker"):
        results = evaluate_rule(no_losses, f"LossNotDecreasing:semantics={semantics}")
        assert len(results) == 1 and results[0].not_evaluated and "losses" in results[0].not_evaluated


def test_loss_not_decreasing_parses_sagemaker_strings_and_rejects_bad_values(tmp_path):
    run = write_run(tmp_path / "run", {0: {"loss_0": 1.0}})
    rule = create_rule(open_trial(run), RuleSpec("LossNotDecreasing", {
        "collection_names": "None", "tensor_regex": "loss_0, loss_1", "use_losses_collection": "False",
        "num_steps": "5", "diff_percent": "0.5", "increase_threshold_percent": "10", "mode": "TRAIN",
    }))
    assert rule.tensor_regex == ["loss_0", "loss_1"] and rule.collection_names is None
    assert (rule.num_steps, rule.diff_percent, rule.use_losses_collection, rule.mode) == (5, 0.5, False, "TRAIN")
    for bad, words in [({"num_steps": "0"}, "num_steps"), ({"diff_percent": "150"}, "diff_percent"),
                       ({"mode": "TRAINING"}, "mode"), ({"num_steps": "ten"}, "ten")]:
        with pytest.raises(ConfigError, match=words):
            create_rule(open_trial(run), RuleSpec("LossNotDecreasing", bad))


# -- Overfit, Overtraining: blocks of TRAIN steps and validation passes -----------------------------


def _epochs(train: list[list[float]], evaluation: list[list[float]]):
    """Alternating TRAIN blocks and validation passes → (steps, modes)."""
    steps, modes, step = {}, {}, 0
    for train_block, eval_block in zip(train, evaluation, strict=False):
        for value in train_block:
            steps[step], modes[step] = {"CrossEntropyLoss_output_0": value}, "TRAIN"
            step += 1
        for value in eval_block:
            steps[step], modes[step] = {"CrossEntropyLoss_output_0": value}, "EVAL"
            step += 1
    return steps, modes


def _random_epochs(rng, epochs):
    train, evaluation, level, gap = [], [], 2.0, 0.0
    for _ in range(epochs):
        level *= float(rng.uniform(0.7, 1.0))
        gap += float(rng.uniform(-0.05, 0.2))
        train.append((level * (1 + rng.normal(0, 0.05, int(rng.integers(3, 15))))).tolist())
        evaluation.append((level * (1 + gap) * (1 + rng.normal(0, 0.02, int(rng.integers(1, 4))))).tolist())
    return train, evaluation


def _overfit_oracle(train, evaluation, patience, ratio_threshold, train_window):
    history, streak, step = [], 0, 0
    total = sum(map(len, train)) + sum(map(len, evaluation))
    for train_block, eval_block in zip(train, evaluation, strict=False):
        history.extend(train_block)
        step += len(train_block) + len(eval_block)
        reference = float(np.mean(history[-train_window:]))
        ratio = (float(np.mean(eval_block)) - reference) / abs(reference)
        streak = streak + 1 if ratio > ratio_threshold else 0
        if streak >= patience:
            # judged when the next TRAIN step arrives, or at the end of the run
            return step if step < total else step - 1
    return None


@pytest.mark.parametrize("seed", range(8))
def test_overfit_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(100 + seed)
    train, evaluation = _random_epochs(rng, int(rng.integers(4, 10)))
    patience, ratio, window = int(rng.integers(1, 4)), float(rng.choice([0.05, 0.1, 0.25])), int(rng.integers(1, 12))
    steps, modes = _epochs(train, evaluation)
    run = write_run(tmp_path / "run", steps, modes=modes)
    spec = RuleSpec("Overfit", {"patience": str(patience), "ratio_threshold": str(ratio), "train_window": str(window),
                                "semantics": "sagemaker"})
    results = evaluate_rule(run, spec)
    expected = _overfit_oracle(train, evaluation, patience, ratio, window)
    assert first_firing(results) == expected
    if expected is not None:
        assert "regularisation" in next(r for r in results if r.fired).fix_hint


def test_overfit_documented_defaults_fire_on_a_normal_gap_calibrated_ones_do_not(tmp_path):
    # a healthy run: validation loss 15 % above training loss, both falling
    train = [[2.0 * 0.8**epoch] * 10 for epoch in range(8)]
    evaluation = [[2.0 * 0.8**epoch * 1.15] * 2 for epoch in range(8)]
    run = write_run(tmp_path / "run", *_epochs(train, evaluation)[:1], modes=_epochs(train, evaluation)[1])
    assert first_firing(evaluate_rule(run, "Overfit:patience=1,ratio_threshold=0.1,semantics=sagemaker")) is not None
    assert first_firing(evaluate_rule(run, "Overfit")) is None
    # a gap widening to 105 % while the validation loss still falls: SageMaker's ratio fires after
    # `patience` passes; calibrated semantics do not (the model still generalises better each pass)
    widening = [[2.0 * 0.8**epoch * (1 + 0.15 * epoch)] * 2 for epoch in range(8)]
    run = write_run(tmp_path / "wide", _epochs(train, widening)[0], modes=_epochs(train, widening)[1])
    assert first_firing(evaluate_rule(run, "Overfit:semantics=sagemaker")) is not None
    assert first_firing(evaluate_rule(run, "Overfit")) is None
    # real overfitting: the validation loss turns up after epoch 3 while training keeps falling
    train = [[2.0 * 0.8**epoch] * 10 for epoch in range(10)]
    rising = [[2.0 * 0.8 ** min(epoch, 3) * 1.15 * (1 + 0.2 * max(0, epoch - 3))] * 2 for epoch in range(10)]
    steps, modes = _epochs(train, rising)
    run = write_run(tmp_path / "over", steps, modes=modes)
    results = evaluate_rule(run, "Overfit")
    fired = next(r for r in results if r.fired)
    # best pass: epoch 3; passes 4, 5, 6 above it; judged when epoch 7's training starts
    assert fired.step == sum(len(t) + len(e) for t, e in zip(train[:7], rising[:7], strict=True))
    assert fired.certain and "rose" in fired.message


def test_overfit_without_validation_reports_not_evaluated(tmp_path):
    run = write_run(tmp_path / "run", {s: {"CrossEntropyLoss_output_0": 1.0 / (s + 1)} for s in range(6)})
    for semantics in ("calibrated", "sagemaker"):
        results = evaluate_rule(run, f"Overfit:semantics={semantics}")
        assert len(results) == 1 and results[0].not_evaluated and "EVAL" in results[0].not_evaluated


def test_overfit_nan_validation_pass_is_skipped(tmp_path):
    train = [[1.0] * 3] * 4
    evaluation = [[1.5], [float("nan")], [1.5], [1.5]]
    run = write_run(tmp_path / "run", *_epochs(train, evaluation)[:1], modes=_epochs(train, evaluation)[1])
    results = evaluate_rule(run, "Overfit:patience=3,semantics=sagemaker")
    assert first_firing(results) == 15  # passes 1, 3, 4 count (the NaN pass neither counts nor resets)


def _overtraining_oracle(order, patience_train, patience_validation, delta, smoothing):
    """order: ('T', step, value) and ('E', last_step, values) in the order the rule judges them."""
    best_t = best_v = None
    since_t = since_v = 0
    recent: list[float] = []
    for kind, step, payload in order:
        if kind == "T":
            recent = (recent + [payload])[-smoothing:]
            value = sum(recent) / len(recent)
            if best_t is None or value < best_t - delta * abs(best_t):
                best_t, since_t = value, 0
            else:
                since_t += 1
        else:
            value = float(np.mean(payload))
            if best_v is None or value < best_v - delta * abs(best_v):
                best_v, since_v = value, 0
            else:
                since_v += 1
        stalled_validation = best_v is not None and since_v >= patience_validation
        if stalled_validation or (best_v is None and best_t is not None and since_t >= patience_train):
            return step
    return None


@pytest.mark.parametrize("seed", range(8))
def test_overtraining_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(200 + seed)
    epochs = int(rng.integers(5, 12))
    train, evaluation, level = [], [], 2.0
    for epoch in range(epochs):
        level *= float(rng.uniform(0.9, 1.0)) if epoch < epochs // 2 else float(rng.uniform(0.995, 1.02))
        train.append((level * (1 + rng.normal(0, 0.02, 6))).tolist())
        evaluation.append([level * 1.1 * float(rng.uniform(0.98, 1.05))])
    steps, modes = _epochs(train, evaluation)
    run = write_run(tmp_path / "run", steps, modes=modes)
    patience_train, patience_validation = int(rng.integers(3, 15)), int(rng.integers(1, 4))
    delta, smoothing = float(rng.choice([0.0, 0.005, 0.01, 0.05])), int(rng.integers(1, 8))
    # the rule judges each TRAIN step when it is checked and a validation pass when the next
    # TRAIN step is checked (or at the end)
    order, step = [], 0
    for index, (train_block, eval_block) in enumerate(zip(train, evaluation, strict=False)):
        for position, value in enumerate(train_block):
            order.append(("T", step, value))
            if position == 0 and index > 0:
                order.append(("E", step, evaluation[index - 1]))
            step += 1
        step += len(eval_block)
    order.append(("E", step - 1, evaluation[-1]))
    expected = _overtraining_oracle(order, patience_train, patience_validation, delta, smoothing)
    spec = RuleSpec("Overtraining", {"patience_train": str(patience_train),
                                     "patience_validation": str(patience_validation),
                                     "delta": str(delta), "smoothing": str(smoothing), "semantics": "sagemaker"})
    assert first_firing(evaluate_rule(run, spec)) == expected


def test_overtraining_relative_delta_stays_silent_on_a_small_converging_loss(tmp_path):
    # cross-entropy converging from 0.2 to 0.05: each step improves by ~2 %, never by 0.1 absolute
    values = [0.2 * 0.98**s for s in range(70)]
    run = write_run(tmp_path / "run", {s: {"CrossEntropyLoss_output_0": v} for s, v in enumerate(values)})
    assert first_firing(evaluate_rule(run, "Overtraining:semantics=sagemaker")) is None
    assert first_firing(evaluate_rule(run, "Overtraining:delta=0.1,patience_train=5,smoothing=1,"
                                           "semantics=sagemaker")) is not None
    flat = write_run(tmp_path / "flat", {s: {"CrossEntropyLoss_output_0": 0.5} for s in range(40)})
    results = evaluate_rule(flat, "Overtraining:semantics=sagemaker")
    assert first_firing(results) == 20 and "converged" in next(r for r in results if r.fired).fix_hint
    # calibrated: a training loss alone is never overtraining (a flat one is convergence): not evaluated
    for run in (tmp_path / "run", flat):
        results = evaluate_rule(run, "Overtraining")
        assert [r.not_evaluated is not None for r in results] == [True] and "validation" in results[0].not_evaluated


# -- Underfitting ------------------------------------------------------------------------------------


def _underfitting_oracle(steps, values, warmup, min_improvement, baseline, window):
    for index, step in enumerate(steps):
        if step < warmup:
            continue
        series = [v for v in values[: index + 1] if math.isfinite(v)]
        if len(series) < 2:
            continue
        width = min(window, len(series) // 2)
        start, current = np.mean(series[:width]), np.mean(series[-width:])
        reference = baseline if baseline is not None else start
        if current > reference - min_improvement * abs(reference):
            return step
    return None


@pytest.mark.parametrize("seed", range(8))
def test_underfitting_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(300 + seed)
    count = int(rng.integers(10, 60))
    end = float(rng.choice([0.3, 0.85, 0.95, 1.0, 1.3]))
    values = (2.3 * np.linspace(1.0, end, count) * (1 + rng.normal(0, 0.02, count))).tolist()
    if seed % 3 == 0:
        values[int(rng.integers(0, count))] = float("nan")
    steps = list(range(count))
    warmup, min_improvement = int(rng.integers(0, 30)), float(rng.choice([0.05, 0.1, 0.3]))
    baseline = float(math.log(10)) if seed % 2 else None
    window = int(rng.integers(1, 8))
    run = write_run(tmp_path / "run", dict(zip(steps, ({"CrossEntropyLoss_output_0": v} for v in values), strict=True)))
    parameters = {"warmup_steps": str(warmup), "min_improvement": str(min_improvement), "window": str(window),
                  "baseline": str(baseline), "semantics": "sagemaker"}
    expected = _underfitting_oracle(steps, values, warmup, min_improvement, baseline, window)
    assert first_firing(evaluate_rule(run, RuleSpec("Underfitting", parameters))) == expected


def test_underfitting_flat_loss_fires_after_warmup_learning_loss_does_not(tmp_path):
    flat = write_run(tmp_path / "flat", {s: {"CrossEntropyLoss_output_0": 2.30 + 0.01 * np.sin(s)} for s in range(150)})
    assert first_firing(evaluate_rule(flat, "Underfitting:semantics=sagemaker")) == 100
    # calibrated: a verdict on the whole run, given at its end
    results = evaluate_rule(flat, "Underfitting")
    assert [r.step for r in results] == [149] and results[0].fired and not results[0].certain
    assert "learning rate" in results[0].fix_hint
    learning = write_run(tmp_path / "learn", {s: {"CrossEntropyLoss_output_0": 2.3 * 0.99**s} for s in range(150)})
    assert first_firing(evaluate_rule(learning, "Underfitting")) is None
    assert first_firing(evaluate_rule(learning, "Underfitting:semantics=sagemaker")) is None


def _competing(run: str) -> str:
    """The run as a hook that saw two independent optimizers (a GAN) writes it."""
    import json
    from pathlib import Path

    for path in Path(run, "collections").rglob("*_collections.json"):
        document = json.loads(path.read_text())
        document["_meta"]["independent_optimizers"] = 2
        path.write_text(json.dumps(document))
    return run


def test_loss_not_decreasing_leaves_competing_objectives_alone_but_not_nan(tmp_path):
    """A GAN's discriminator loss rises as its generator learns (measured 0.84 -> 1.37 on a
    healthy one, which the rule used to stop): with two independent optimizers a rise or a
    plateau is the game; a NaN loss is still a certain finding."""
    rng = np.random.default_rng(0)
    rising = np.concatenate([np.full(16, 0.85), np.linspace(0.9, 1.4, 24)]) * (1 + rng.normal(0, 0.01, 40))
    losses = {s: {"loss_backward_output_0": float(v)} for s, v in enumerate(rising)}
    plain = evaluate_rule(write_run(tmp_path / "plain", losses), "LossNotDecreasing")
    assert first_firing(plain) is not None
    competing = evaluate_rule(_competing(write_run(tmp_path / "gan", losses)), "LossNotDecreasing")
    assert first_firing(competing) is None
    assert any(
        facts.get("kind") == "competing objectives"
        for result in competing for facts in result.details.get("losses", {}).values()
    )  # fmt: skip
    losses[39] = {"loss_backward_output_0": float("nan")}
    nan = evaluate_rule(_competing(write_run(tmp_path / "gan-nan", losses)), "LossNotDecreasing")
    fired = [result for result in nan if result.fired]
    assert [result.step for result in fired] == [39] and fired[0].certain
