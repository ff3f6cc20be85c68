"""ClassImbalance, Confusion and StalledTrainingRule: deleted smdebug vectors, numpy oracles on
random labels/predictions (class ids and logits, PyTorch loss-input names), live runs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, open_trial, write_run
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule
from trainguard.rules.builtin._classification import class_ids

LOSS_INPUTS = {"predictions": ["CrossEntropyLoss_input_0"], "labels": ["CrossEntropyLoss_input_1"]}

# -- ClassImbalance ------------------------------------------------------------------------------


def test_class_imbalance_deleted_vector_fires_at_step_3(tmp_path):
    labels = np.concatenate([np.zeros(990), np.ones(10)])
    run = write_run(tmp_path / "run", {3: {"labels_0": labels}})
    spec = RuleSpec("ClassImbalance", {"labels_regex": "labels_0", "predictions_regex": "labels_0"})
    results = evaluate_rule(run, spec)
    assert first_firing(results) == 3
    assert results[0].details["imbalance_ratio"] == pytest.approx(99.0)
    assert "WeightedRandomSampler" in results[0].fix_hint


def _imbalance_oracle(batches, threshold_imbalance, threshold_misprediction, samples, start):
    counts: dict[int, int] = {}
    window: list[tuple[np.ndarray, np.ndarray]] = []
    bad_since: dict[int, int] = {}  # class -> first step of its current mispredicted streak
    for step, (y, predicted) in enumerate(batches):
        for cls in y:
            counts[int(cls)] = counts.get(int(cls), 0) + 1
        if step >= start:
            window.append((y, predicted))
            while sum(len(item[0]) for item in window) - len(window[0][0]) >= samples:
                window.pop(0)
        if sum(counts.values()) < samples:
            continue
        if max(counts.values()) / min(counts.values()) > threshold_imbalance:
            return step
        bad: list[int] = []
        if sum(len(item[0]) for item in window) >= samples:
            wy = np.concatenate([item[0] for item in window])
            wp = np.concatenate([item[1] for item in window])
            judged = [cls for cls in np.unique(wy) if (wy == cls).sum() >= 10]
            bad = [cls for cls in judged if np.mean(wp[wy == cls] != cls) > threshold_misprediction]
            others = np.isin(wy, [cls for cls in judged if cls not in bad])
            # a class-specific failure: few classes missed, the others mostly right
            if not (bad and 2 * len(bad) <= len(judged) and others.any()
                    and np.mean(wp[others] != wy[others]) <= 1 - threshold_misprediction):  # fmt: skip
                bad = []
        # ...that lasts: still there at twice the step it was first seen
        bad_since = {cls: bad_since.get(cls, step) for cls in bad}
        if any(step >= 2 * since for since in bad_since.values()):
            return step
    # or still there when training ended (reported at the last step)
    return len(batches) - 1 if bad_since and sum(counts.values()) >= samples else None


@pytest.mark.parametrize("seed", range(10))
def test_class_imbalance_matches_oracle_on_logits(tmp_path, seed):
    rng = np.random.default_rng(seed)
    classes, batch, count = int(rng.integers(2, 6)), int(rng.integers(16, 64)), int(rng.integers(10, 40))
    weights = rng.dirichlet(np.full(classes, float(rng.choice([0.3, 5.0]))))
    accuracy = np.linspace(float(rng.uniform(0, 0.3)), float(rng.uniform(0.2, 1.0)), count)
    batches, steps = [], {}
    for step in range(count):
        y = rng.choice(classes, size=batch, p=weights)
        logits = rng.normal(0, 1, (batch, classes))
        right = rng.random(batch) < accuracy[step]
        logits[right, y[right]] += 10  # these samples are predicted right
        batches.append((y, np.argmax(logits, axis=1)))
        steps[step] = {"CrossEntropyLoss_input_0": logits.astype(np.float32), "CrossEntropyLoss_input_1": y}
    run = write_run(tmp_path / "run", steps, collections=LOSS_INPUTS)
    params = {"threshold_imbalance": str(float(rng.choice([3, 10, 50]))),
              "threshold_misprediction": str(float(rng.choice([0.3, 0.5, 0.7]))),
              "samples": str(int(rng.integers(50, 400))), "misprediction_start_step": str(int(rng.integers(0, 10)))}
    expected = _imbalance_oracle(batches, float(params["threshold_imbalance"]),
                                 float(params["threshold_misprediction"]), int(params["samples"]),
                                 int(params["misprediction_start_step"]))
    assert first_firing(evaluate_rule(run, RuleSpec("ClassImbalance", params))) == expected


def test_class_imbalance_waits_for_training_before_judging_mispredictions(tmp_path):
    # balanced labels; the model gets classes 0-2 right but predicts class 0 for class 3 for 120
    # steps, then learns it too
    rng = np.random.default_rng(0)
    steps = {}
    for step in range(200):
        y = rng.integers(0, 4, 32)
        predicted = np.where(y == 3, 0, y) if step < 120 else y.copy()
        steps[step] = {"labels": y, "predictions": predicted}
    run = write_run(tmp_path / "run", steps)
    # documented behaviour (from step 0, any class): fires as soon as 500 labels were seen
    documented = "ClassImbalance:misprediction_start_step=0,class_specific=False"
    assert first_firing(evaluate_rule(run, documented)) == 15
    # from step 0, class-specific: class 3 missed since step 15 is reported at step 30
    assert first_firing(evaluate_rule(run, "ClassImbalance:misprediction_start_step=0")) == 30
    # calibrated: counted from step 100, class 3 is missed from step 115 and learned at step 120,
    # long before step 230: a class learned later than the others, not a failing class
    results = evaluate_rule(run, "ClassImbalance")
    assert first_firing(results) is None
    assert any(result.details.get("mispredicted_since") == {3: 115} for result in results)
    # never learned: reported at step 230, and in a run that ends before then, at its end
    for step in range(120, 300):
        y = rng.integers(0, 4, 32)
        steps[step] = {"labels": y, "predictions": np.where(y == 3, 0, y)}
    never = evaluate_rule(write_run(tmp_path / "never", steps), "ClassImbalance")
    fired = next(result for result in never if result.fired)
    assert fired.step == 230 and "class 3 is mispredicted" in fired.message and "class" in fired.fix_hint
    short = evaluate_rule(write_run(tmp_path / "short", {s: steps[s] for s in range(200)}), "ClassImbalance")
    assert [result.step for result in short if result.fired] == [199]
    assert short[-1].details["at_end_of_training"] is True


@pytest.mark.parametrize("model", ["one_class", "random"])
def test_class_imbalance_is_silent_while_most_classes_are_mispredicted(tmp_path, model):
    """An untrained model predicting one class for everything (a slow start), or a model guessing
    (random labels): not a class-specific failure, so not ClassImbalance's (Underfitting's)."""
    rng = np.random.default_rng(1)
    steps = {}
    for step in range(300):
        y = rng.integers(0, 5, 32)
        predicted = np.zeros(32, dtype=np.int64) if model == "one_class" else rng.integers(0, 5, 32)
        steps[step] = {"labels": y, "predictions": predicted}
    run = write_run(tmp_path / "run", steps)
    results = evaluate_rule(run, "ClassImbalance")
    assert first_firing(results) is None
    assert results[-1].details["not_learned_yet"] is True
    assert first_firing(evaluate_rule(run, "ClassImbalance:class_specific=False")) is not None  # SageMaker's
    # one class of five left unlearned is the rule's finding
    for step in steps:
        steps[step]["predictions"] = np.where(steps[step]["labels"] == 4, 0, steps[step]["labels"])
    fixed = write_run(tmp_path / "one-class-missed", steps)
    assert first_firing(evaluate_rule(fixed, "ClassImbalance")) is not None


def test_class_imbalance_live_run_missing_tensors_and_bad_parameters(tmp_path):
    live = write_run(tmp_path / "live", {0: {"labels": np.zeros(10), "predictions": np.zeros(10)}}, finished=False)
    rule = create_rule(open_trial(live), "ClassImbalance")
    assert rule.evaluate(5) is None
    assert not rule.evaluate(0).fired  # waiting for 500 labels
    none = write_run(tmp_path / "none", {0: {"fc.weight": np.ones(2)}})
    result = evaluate_rule(none, "ClassImbalance")[0]
    assert {item.collection for item in result.missing} == {"labels", "predictions"}
    with pytest.raises(ConfigError, match="threshold_misprediction"):
        create_rule(open_trial(none), RuleSpec("ClassImbalance", {"threshold_misprediction": "1.5"}))
    with pytest.raises(ConfigError, match="labels_regex"):
        create_rule(open_trial(none), RuleSpec("ClassImbalance", {"labels_regex": "(["}))
    rule = create_rule(open_trial(none), RuleSpec("ClassImbalance", {"argmax": "True", "samples": "100"}))
    assert rule.argmax is True and rule.samples == 100


@pytest.mark.parametrize(
    "labels, predictions, expected_y, expected_p",
    [
        ([0, 2, 1], [[9, 0, 0], [0, 0, 9], [0, 9, 0]], [0, 2, 1], [0, 2, 1]),  # logits N×C
        ([[0, 1], [1, 0]], np.moveaxis(np.eye(2)[[[1, 1], [0, 0]]], -1, 1), [0, 1, 1, 0], [1, 1, 0, 0]),  # N×C×H
        ([[0, 1.0], [1.0, 0]], [[0.2, 0.8], [0.3, 0.7]], [1, 0], [1, 1]),  # one-hot targets
        ([0, 1, 1], [-2.0, 3.0, -0.5], [0, 1, 1], [0, 1, 0]),  # binary logits
        ([0, 1, 1], [0.2, 0.9, 0.4], [0, 1, 1], [0, 1, 0]),  # binary probabilities
        ([0, -100, 2], [0, 1, 1], [0, 2], [0, 1]),  # ignore_index dropped with its prediction
        ([0, 1], [[np.nan, 1.0], [np.nan, np.nan]], [0], [1]),  # NaN scores: no crash, dropped
    ],
)
def test_class_ids_from_saved_tensors(labels, predictions, expected_y, expected_p):
    y, p = class_ids(np.asarray(labels, dtype=np.float64), np.asarray(predictions, dtype=np.float64))
    assert y.tolist() == expected_y and p.tolist() == expected_p


# -- Confusion -----------------------------------------------------------------------------------

# SageMaker's defaults: every step, that step's matrix, min_diag 0.9, max_off_diag 0.1
DOCUMENTED = {"start_step": "0", "samples": "1", "min_diag": "0.9", "max_off_diag": "0.1", "semantics": "sagemaker"}


def test_confusion_deleted_vectors(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 100)
    identity = write_run(tmp_path / "identity", {0: {"labels": y, "predictions": y.copy()}})
    assert first_firing(evaluate_rule(identity, RuleSpec("Confusion", DOCUMENTED))) is None
    assert first_firing(evaluate_rule(identity, "Confusion")) is None  # step 0 < start_step: not judged
    y = np.arange(10)
    y_hat = y.copy()
    y_hat[4] = 7
    run = write_run(tmp_path / "confused", {0: {"labels": y, "predictions": y_hat}})
    assert first_firing(evaluate_rule(run, RuleSpec("Confusion", DOCUMENTED))) == 0
    spec = RuleSpec("Confusion", {**DOCUMENTED, "min_diag": "0.0", "max_off_diag": "0.01"})
    results = evaluate_rule(run, spec)
    assert first_firing(results) == 0
    assert results[0].details["problems"] == [{"predicted": 7, "label": 4, "kind": "off_diag", "share": 0.5}]
    # calibrated semantics do not judge a class from 2 predictions (1 of them wrong is noise) ...
    assert first_firing(evaluate_rule(run, RuleSpec("Confusion", {"start_step": "0", "samples": "1"}))) is None
    # ... but do once there are enough: half of 40 class-7 predictions are class 4
    many = write_run(tmp_path / "confused-40", {0: {"labels": np.repeat(y, 20), "predictions": np.repeat(y_hat, 20)}})
    assert first_firing(evaluate_rule(many, RuleSpec("Confusion", {"start_step": "0", "samples": "1"}))) == 0


def test_confusion_calibrated_thresholds_stay_silent_on_a_good_noisy_model_and_fire_on_swapped_labels(tmp_path):
    rng = np.random.default_rng(1)
    steps, swapped = {}, {}
    for step in range(200):
        y = rng.integers(0, 4, 32)
        predicted = np.where(rng.random(32) < 0.85, y, rng.integers(0, 4, 32))  # 85 % accurate
        steps[step] = {"labels": y, "predictions": predicted}
        # class 3 labelled as class 2 in half of the examples: the model cannot tell them apart
        confused = np.where((y == 3) & (rng.random(32) < 0.5), 2, predicted)
        swapped[step] = {"labels": y, "predictions": confused}
    good = write_run(tmp_path / "good", steps)
    assert first_firing(evaluate_rule(good, RuleSpec("Confusion", DOCUMENTED))) == 0
    assert first_firing(evaluate_rule(good, "Confusion")) is None
    bad = write_run(tmp_path / "bad", swapped)
    results = evaluate_rule(bad, "Confusion")
    fired = next(result for result in results if result.fired)
    # judged from step 100 on (the window starts there); ~40 % of class 2's predictions are class 3,
    # surely above max_off_diag 0.3 (99 % Wilson interval) once the window holds ~150 of them
    assert 100 <= fired.step <= 125 and "class 2 are class 3" in fired.message
    assert fired.details["problems"][0]["share"] > 0.3


def test_confusion_calibrated_judges_a_share_only_when_it_is_sure(tmp_path):
    # 15 right of 32 predictions of class 1 (47 %) is not surely under min_diag 0.5 (99 % interval
    # 27-68 %): silent, as on the detection corpus' healthy hard task; SageMaker semantics judge the
    # share itself and fire. 200 right of 500 (40 %, interval 35-46 %) is surely under: fires.
    y = np.array([1] * 15 + [0] * 9 + [2] * 8)
    few = write_run(tmp_path / "few", {0: {"labels": y, "predictions": np.ones(32, dtype=np.int64)}})
    calibrated = RuleSpec("Confusion", {"start_step": "0", "samples": "32", "max_off_diag": "0.9"})
    assert first_firing(evaluate_rule(few, calibrated)) is None
    documented = RuleSpec("Confusion", {**DOCUMENTED, "min_diag": "0.5", "max_off_diag": "0.9"})
    assert first_firing(evaluate_rule(few, documented)) == 0
    y = np.array([1] * 200 + [0] * 150 + [2] * 150)
    many = write_run(tmp_path / "many", {0: {"labels": y, "predictions": np.ones(500, dtype=np.int64)}})
    results = evaluate_rule(many, RuleSpec("Confusion", {"start_step": "0", "max_off_diag": "0.9"}))
    assert first_firing(results) == 0 and "only 40 % of the predictions of class 1 are right" in results[0].message


def _confusion_oracle(batches, min_diag, max_off_diag, start, samples, category_no):
    window: list[tuple[np.ndarray, np.ndarray]] = []
    for step, (y, predicted) in enumerate(batches):
        if step < start:
            continue
        window.append((y, predicted))
        while len(window) > 1 and sum(len(item[0]) for item in window) - len(window[0][0]) >= samples:
            window.pop(0)
        wy = np.concatenate([item[0] for item in window])
        wp = np.concatenate([item[1] for item in window])
        size = category_no or int(max(wy.max(), wp.max())) + 1
        matrix = np.zeros((size, size))
        for label, guess in zip(wy, wp, strict=False):
            if label < size and guess < size:
                matrix[label, guess] += 1
        for column in range(size):
            total = matrix[:, column].sum()
            if total == 0:
                continue
            if matrix[column, column] / total < min_diag:
                return step
            if any(matrix[row, column] / total > max_off_diag for row in range(size) if row != column):
                return step
    return None


@pytest.mark.parametrize("seed", range(10))
def test_confusion_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(50 + seed)
    classes, batch, count = int(rng.integers(2, 6)), int(rng.integers(8, 40)), int(rng.integers(5, 25))
    accuracy = float(rng.uniform(0.6, 1.0))
    swap = rng.random() < 0.5  # confuse class 0 with class 1 in part of the predictions
    batches, steps = [], {}
    for step in range(count):
        y = rng.integers(0, classes, batch)
        predicted = np.where(rng.random(batch) < accuracy, y, rng.integers(0, classes, batch))
        if swap:
            predicted = np.where((y == 0) & (rng.random(batch) < 0.3), 1, predicted)
        batches.append((y, predicted))
        steps[step] = {"CrossEntropyLoss_input_1": y, "CrossEntropyLoss_input_0": np.eye(classes)[predicted] * 5}
    run = write_run(tmp_path / "run", steps, collections=LOSS_INPUTS)
    min_diag, max_off = float(rng.choice([0.5, 0.7, 0.9])), float(rng.choice([0.1, 0.2, 0.4]))
    start, samples = int(rng.integers(0, 5)), int(rng.integers(1, 200))
    category_no = int(classes + 1) if seed % 3 == 0 else None
    params = {"min_diag": str(min_diag), "max_off_diag": str(max_off), "start_step": str(start),
              "samples": str(samples), "category_no": str(category_no), "semantics": "sagemaker"}
    expected = _confusion_oracle(batches, min_diag, max_off, start, samples, category_no)
    assert first_firing(evaluate_rule(run, RuleSpec("Confusion", params))) == expected


# -- StalledTrainingRule ---------------------------------------------------------------------------


def test_stalled_training_fires_after_threshold_seconds_without_a_new_step(tmp_path):
    steps = {0: {"CrossEntropyLoss_output_0": 1.0}}
    live = write_run(tmp_path / "live", steps, finished=False)
    trial = open_trial(live)
    rule = create_rule(trial, RuleSpec("StalledTrainingRule", {"threshold": "60", "stop_training_on_fire": "True"}))
    now = time.time()
    assert rule.check(0) is None
    assert rule.check_idle(now + 30) is None
    result = rule.check_idle(now + 61)
    assert result is not None and result.fired and result.step == 0
    assert result.details["stop_training"] is True and "py-spy" in result.fix_hint
    assert rule.check_idle(now + 70) is None  # reported once per threshold of stall
    assert rule.check_idle(now + 122).fired
    # a new step resets the clock (written by a second writer session into the same live run)
    from trainguard.format.layout import worker_name
    from trainguard.modes import ModeKeys
    from trainguard.storage import open_store
    from trainguard.writer.thread import StepWriter

    writer = StepWriter(open_store(live), worker_name(0))
    writer.begin_step(1, ModeKeys.TRAIN, 1)
    writer.add_tensor("CrossEntropyLoss_output_0", np.ones(1), nbytes=8)
    writer.end_step()
    assert writer.close(timeout=30)
    assert rule.check_idle(now + 130) is None
    assert rule.check_idle(now + 189) is None  # 59 s since step 1 appeared
    assert rule.check_idle(now + 191).fired
    # training ended: never stalled
    from trainguard.format.layout import END_OF_TRAINING

    open_store(live).write(END_OF_TRAINING, b"")
    assert rule.check_idle(now + 10_000) is None


def test_stalled_training_counts_from_rule_start_when_no_step_appears(tmp_path):
    live = write_run(tmp_path / "live", {}, finished=False)
    rule = create_rule(open_trial(live), "StalledTrainingRule:threshold=5")
    assert rule.check_idle(time.time()) is None
    result = rule.check_idle(time.time() + 6)
    assert result.fired and result.step == -1 and "no step yet" in result.message


def test_class_imbalance_does_not_judge_a_vocabulary(tmp_path):
    """A language model's labels are its next tokens (batch x sequence length of its integer
    input): their frequencies follow Zipf's law (a healthy tiny transformer LM fired 'class 46
    has 14x as many labels as class 2' at step 0): next-token targets are not classes, the run is
    not evaluated, and says why. Per-sample labels of the same counts fire."""
    rng = np.random.default_rng(0)
    vocabulary = 50
    zipf = 1.0 / np.arange(1, vocabulary + 1)
    zipf /= zipf.sum()
    token_steps, sample_steps = {}, {}
    for step in range(10):
        tokens = rng.choice(vocabulary, size=(8, 17), p=zipf)
        labels = tokens[:, 1:].reshape(-1)
        logits = rng.normal(size=(labels.size, vocabulary)).astype(np.float32)
        common = {"CrossEntropyLoss_input_0": logits, "CrossEntropyLoss_input_1": labels,
                  "LM_emb.weight": np.ones((vocabulary, 4), dtype=np.float32)}  # fmt: skip
        token_steps[step] = {**common, "LM_input_0": tokens[:, :-1]}
        sample_steps[step] = {**common, "LM_input_0": rng.normal(size=(labels.size, 4)).astype(np.float32)}
    tokens_run = write_run(tmp_path / "lm", token_steps, collections=LOSS_INPUTS)
    results = evaluate_rule(tokens_run, "ClassImbalance")
    assert first_firing(results) is None
    assert results[-1].not_evaluated and "per-token targets over a vocabulary" in results[-1].not_evaluated
    samples_run = write_run(tmp_path / "samples", sample_steps, collections=LOSS_INPUTS)
    assert first_firing(evaluate_rule(samples_run, "ClassImbalance")) is not None


def test_class_imbalance_does_not_judge_pixels(tmp_path):
    """Segmentation: one label per pixel of a float image; the background outnumbers the object
    by far in every healthy data set."""
    rng = np.random.default_rng(1)
    steps = {}
    for step in range(6):
        images = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
        masks = (rng.random((4, 8, 8)) < 0.04).astype(np.int64)  # 4 % object pixels
        steps[step] = {"Seg_input_0": images, "Seg_conv.weight": np.ones((2, 3, 1, 1), dtype=np.float32),
                       "CrossEntropyLoss_input_0": rng.normal(size=(4, 2, 8, 8)).astype(np.float32),
                       "CrossEntropyLoss_input_1": masks}  # fmt: skip
    results = evaluate_rule(write_run(tmp_path / "seg", steps, collections=LOSS_INPUTS), "ClassImbalance:samples=200")
    assert first_firing(results) is None and results[-1].details["token_level"] is True


def test_class_imbalance_says_a_regression_or_distillation_run_is_not_classification(tmp_path):
    for loss in ("MSELoss_output_0", "loss_kl_div_output_0"):
        run = write_run(tmp_path / loss, {s: {loss: 0.5, "fc.weight": np.ones(2)} for s in range(3)})
        result = evaluate_rule(run, "ClassImbalance")[-1]
        assert result.not_evaluated and "not class labels" in result.message, result.message
        assert loss.removeprefix("loss_").removesuffix("_output_0") in result.message
    # a classification loss without its inputs saved: the capture is what is missing
    run = write_run(tmp_path / "ce", {s: {"CrossEntropyLoss_output_0": 0.5} for s in range(3)})
    result = evaluate_rule(run, "ClassImbalance")[-1]
    assert result.missing and "save the collection 'labels'" in result.message


def test_confusion_does_not_read_a_discriminators_real_and_fake_batches_as_classes(tmp_path):
    """A GAN's discriminator scores a batch of real samples (targets all 1) and one of generated
    samples (targets all 0) each step; once the generator fools it, "the predictions of class 1 are
    class 0" (the detection corpus' healthy DCGAN under every rule). Batch-constant targets name a
    batch's source, not a class: not evaluated. The same scores with mixed labels are judged."""
    rng = np.random.default_rng(12)
    steps = {}
    for step in range(0, 400, 5):
        real, fake = rng.uniform(0.1, 0.45, 64), rng.uniform(0.4, 0.6, 64)  # real mostly scored "fake"
        steps[step] = {
            "BCELoss_input_0": real.astype(np.float32), "BCELoss_input_1": np.ones(64, dtype=np.float32),
            "BCELoss_1_input_0": fake.astype(np.float32), "BCELoss_1_input_1": np.zeros(64, dtype=np.float32),
        }  # fmt: skip
    collections = {"predictions": ["BCELoss_input_0", "BCELoss_1_input_0"],
                   "labels": ["BCELoss_input_1", "BCELoss_1_input_1"]}  # fmt: skip
    results = evaluate_rule(write_run(tmp_path / "gan", steps, collections=collections), "Confusion")
    assert first_firing(results) is None, [r.message for r in results if r.fired][:1]
    assert results[-1].not_evaluated and "each batch's source" in results[-1].not_evaluated
    # a binary classifier with the same scores, each batch's labels mixed: class 0's predictions are class 1s
    for tensors in steps.values():
        mixed = np.r_[np.ones(32), np.zeros(32)].astype(np.float32)
        tensors["BCELoss_input_1"], tensors["BCELoss_1_input_1"] = mixed, mixed
        scores = np.r_[rng.uniform(0.1, 0.45, 32), rng.uniform(0.4, 0.6, 32)].astype(np.float32)
        tensors["BCELoss_input_0"] = tensors["BCELoss_1_input_0"] = scores
    results = evaluate_rule(write_run(tmp_path / "classifier", steps, collections=collections), "Confusion")
    fired = [result for result in results if result.fired]
    assert fired and "of class 0 are class 1" in fired[0].message, fired[:1]
