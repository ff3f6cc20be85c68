"""Oracle tests for the whole-tensor and input-data rules, SageMaker's UnchangedTensor conformance
vector, and robustness on live runs, NaN and empty tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule
from trainguard.trial import create_trial

SEEDS = range(5)
MY_RULES = [
    "AllZero",
    "CheckInputImages",
    "DeadRelu",
    "ExplodingTensor",
    "NLPSequenceRatio",
    "NotNormalizedData",
    "PoorWeightInitialization",
    "SaturatedActivation",
    "UnchangedTensor",
    "VanishingGradient",
    "WeightUpdateRatio",
]


def sagemaker(spec):
    """``spec`` under SageMaker's documented single-step semantics (what the oracles below compute);
    rules without a ``semantics`` parameter are unchanged."""
    from trainguard.rules import builtin_rules

    spec = RuleSpec.parse(spec) if isinstance(spec, str) else spec
    if "semantics" not in builtin_rules()[spec.rule].parameters():
        return spec
    return RuleSpec(spec.rule, {**spec.parameters, "semantics": "sagemaker"})


def fired_steps(results):
    return [result.step for result in results if result.fired]


# -- AllZero --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_all_zero_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    threshold = float(rng.choice([50.0, 90.0, 100.0]))
    steps, expected = {}, []
    for step in range(8):
        tensors = {}
        for name in ("fc1.weight", "gradient/fc1.weight", "fc1.bias"):
            value = rng.normal(size=40)
            value[rng.random(40) < rng.choice([0.0, 0.6, 0.95, 1.0])] = 0.0
            tensors[name] = value
        steps[step] = tensors
        judged = [tensors["fc1.weight"], tensors["gradient/fc1.weight"]]  # default selection: no biases
        if any(100.0 * np.count_nonzero(t == 0) / t.size >= threshold for t in judged):
            expected.append(step)
    path = write_run(tmp_path / "run", steps)
    assert fired_steps(evaluate_rule(path, sagemaker(RuleSpec("AllZero", {"threshold": str(threshold)})))) == expected


def test_all_zero_ignores_zero_biases_by_default_but_checks_them_when_asked(tmp_path):
    path = write_run(tmp_path / "run", {0: {"fc.weight": np.ones(4), "fc.bias": np.zeros(4)}})
    assert first_firing(evaluate_rule(path, sagemaker("AllZero"))) is None
    assert first_firing(evaluate_rule(path, sagemaker(RuleSpec("AllZero", {"collection_names": "biases"})))) == 0
    assert first_firing(evaluate_rule(path, sagemaker(RuleSpec("AllZero", {"tensor_regex": ".*bias"})))) == 0


# -- TensorVariance -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tensor_variance_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    low, high = 1e-4, 5.0
    steps, expected = {}, []
    for step in range(8):
        tensors = {f"l{i}.weight": rng.normal(size=30) * 10 ** rng.uniform(-3, 1) for i in range(2)}
        steps[step] = tensors
        if any(np.var(t) > high or np.var(t) < low for t in tensors.values()):
            expected.append(step)
    path = write_run(tmp_path / "run", steps)
    spec = RuleSpec("TensorVariance", {"min_threshold": str(low), "max_threshold": str(high)})
    assert fired_steps(evaluate_rule(path, sagemaker(spec))) == expected


def test_tensor_variance_needs_a_threshold(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", {0: {"w.weight": np.ones(3)}}))
    with pytest.raises(ConfigError, match="max_threshold and/or min_threshold"):
        create_rule(trial, "TensorVariance")
    with pytest.raises(ConfigError, match="above max_threshold"):
        create_rule(trial, "TensorVariance:min_threshold=2,max_threshold=1")


# -- UnchangedTensor ------------------------------------------------------------------------------


def test_unchanged_tensor_sagemaker_conformance_vector(tmp_path):
    """Deleted SageMaker test_unchanged.py: foo_* = ones at steps 0-2, new boo_* at step 5."""
    steps = {s: {f"foo_{i}": np.ones((3, 3)) for i in range(2)} for s in range(3)}
    steps[5] = {f"boo_{i}": np.ones((3, 3)) for i in range(2)}
    path = write_run(tmp_path / "run", steps, modes="GLOBAL")
    spec = RuleSpec("UnchangedTensor", {"tensor_regex": ".*"})
    assert first_firing(evaluate_rule(path, sagemaker(spec), start=0, end=2)) is None
    assert first_firing(evaluate_rule(path, sagemaker(spec), start=0, end=3)) == 2
    assert first_firing(evaluate_rule(path, sagemaker(spec), start=2, end=3)) == 2  # looks back at steps 0-1
    assert first_firing(evaluate_rule(path, sagemaker(spec), start=3, end=6)) is None


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_steps", [2, 3])
def test_unchanged_tensor_matches_oracle(tmp_path, seed, num_steps):
    rng = np.random.default_rng(seed)
    current = {"fc.weight": rng.normal(size=6), "fc.bias": rng.normal(size=3)}
    steps, expected = {}, []
    for step in range(10):
        for name in current:
            if rng.random() < 0.4:
                current[name] = current[name] + rng.normal(size=current[name].shape) * rng.choice([1e-9, 1.0])
        steps[step] = {name: value.copy() for name, value in current.items()}
    for step in steps:
        if step + 1 < num_steps:
            continue
        window = [steps[p] for p in range(step - num_steps + 1, step + 1)]
        for name in current:
            pairs = zip(window, window[1:], strict=False)
            if all(np.allclose(a[name], b[name], rtol=1e-5, atol=1e-8) for a, b in pairs):
                expected.append(step)
                break
    path = write_run(tmp_path / "run", steps)
    assert (
        fired_steps(evaluate_rule(path, sagemaker(RuleSpec("UnchangedTensor", {"num_steps": str(num_steps)}))))
        == expected
    )


def test_unchanged_tensor_does_not_judge_weights_during_evaluation(tmp_path):
    rng = np.random.default_rng(0)
    steps, modes = {}, {}
    for step in range(9):  # 3 TRAIN steps with changing weights, then 6 EVAL steps with the last ones
        weight = rng.normal(size=4) if step < 3 else steps[2]["fc.weight"]
        steps[step] = {"fc.weight": weight, "Net_input_0": rng.normal(size=2) if step < 3 else np.ones(2)}
        modes[step] = "TRAIN" if step < 3 else "EVAL"
    path = write_run(tmp_path / "run", steps, modes=modes)
    assert first_firing(evaluate_rule(path, sagemaker("UnchangedTensor"))) is None
    # a tensor named explicitly is judged in EVAL too (inputs repeated over evaluation steps)
    assert (
        first_firing(evaluate_rule(path, sagemaker(RuleSpec("UnchangedTensor", {"tensor_regex": "Net_input_0"})))) == 5
    )


# -- SimilarAcrossRuns ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_similar_across_runs_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    base = {s: {"fc.weight": rng.normal(size=5), "gradient/fc.weight": rng.normal(size=5)} for s in range(6)}
    other = {s: {name: value.copy() for name, value in tensors.items()} for s, tensors in base.items()}
    diverge = int(rng.integers(1, 6))
    other[diverge]["fc.weight"] += rng.choice([1e-3, 1.0])
    expected = [s for s in base if any(not np.allclose(base[s][n], other[s][n]) for n in base[s])]
    base_path = write_run(tmp_path / "base", base)
    other_path = write_run(tmp_path / "other", other)
    results = evaluate_rule(base_path, sagemaker(RuleSpec("SimilarAcrossRuns", {"other_trial_0": other_path})))
    assert fired_steps(results) == expected == [diverge]
    assert results[diverge].details["tensor"] == "fc.weight"
    only_gradients = RuleSpec("SimilarAcrossRuns", {"other_trial": other_path, "collection_names": "gradients"})
    assert first_firing(evaluate_rule(base_path, sagemaker(only_gradients))) is None


def test_similar_across_runs_needs_another_trial(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", {0: {"w.weight": np.ones(3)}}))
    with pytest.raises(ConfigError, match="other_trial"):
        create_rule(trial, "SimilarAcrossRuns")


# -- NotNormalizedData and CheckInputImages -------------------------------------------------------


def model_run(tmp_path, name, batches, **kwargs):
    """A run whose model is 'Net': inputs Net_input_0 plus a weight, as the PyTorch hook names them."""
    steps = {
        s: {"Net_input_0": batch, "Net_fc.weight": np.ones((2, 2)), "fc_input_0": batch * 0 + 99}
        for s, batch in enumerate(batches)
    }
    return write_run(tmp_path / name, steps, **kwargs)


@pytest.mark.parametrize("seed", SEEDS)
def test_not_normalized_data_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    mean, scale = rng.choice([0.0, 0.5, 3.0]), rng.choice([0.05, 1.0, 8.0])
    batches = [rng.normal(size=(40, 6)) * scale + mean for _ in range(5)]
    expected = None
    for step in range(5):
        seen = np.concatenate(batches[: step + 1])
        n = len(seen)
        # from 100 samples the plain bounds; from 16, the bounds with 4 standard errors to spare
        z = 0.0 if n >= 100 else 4.0
        means, stds = seen.mean(axis=0), seen.std(axis=0)
        if (
            np.any(np.abs(means) - z * stds / np.sqrt(n) > 1.0)
            or np.any(stds * (1 - z / np.sqrt(2 * n)) > 5.0)
            or seen.std() * (1 + z / np.sqrt(2 * n)) < 0.2
        ):
            expected = step
            break
    path = model_run(tmp_path, "run", batches)
    results = evaluate_rule(path, sagemaker("NotNormalizedData"))
    assert first_firing(results) == expected
    assert all(
        r.details.get("tensor", "Net_input_0") == "Net_input_0" for r in results
    )  # fc_input_0 is not a model input


def test_not_normalized_data_is_per_channel_for_images_and_skips_token_ids(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.normal(size=(50, 3, 4, 4)) for _ in range(3)]
    for batch in images:
        batch[:, 2] += 4.0  # one channel off-centre
    fired = next(
        r for r in evaluate_rule(model_run(tmp_path, "img", images), sagemaker("NotNormalizedData")) if r.fired
    )
    # 50 samples of a channel 4 standard deviations off-centre: significant from the first batch
    assert fired.details["channel"] == 2 and fired.step == 0
    # a borderline mean (1.2, std 1) is not significant in 32 or 64 samples: judged at 100
    borderline = [rng.normal(size=(32, 3)) + np.array([0.0, 1.2, 0.0]) for _ in range(5)]
    firing = [r.step for r in evaluate_rule(model_run(tmp_path, "borderline", borderline), "NotNormalizedData") if r.fired]
    assert firing and firing[0] == 3
    tokens = [rng.integers(0, 500, size=(64, 10)) for _ in range(3)]
    assert first_firing(evaluate_rule(model_run(tmp_path, "tok", tokens), sagemaker("NotNormalizedData"))) is None


def test_not_normalized_data_skips_a_model_fed_by_another_models_output(tmp_path):
    """Chained models (a VAE's heads on the encoder's output, a GAN's discriminator on the
    generator's samples): the second model's input is activations, not data, and activations
    of std 0.05 are no normalisation fault. An input of the same std that is data still fires."""
    rng = np.random.default_rng(0)
    steps, data_steps = {}, {}
    for step in range(5):
        x = rng.normal(size=(64, 6))
        hidden = rng.normal(size=(64, 4)) * 0.05  # the encoder's output, squashed
        common = {"Encoder_input_0": x, "Encoder_fc.weight": np.ones((4, 6)), "Head_fc.weight": np.ones((2, 4))}
        steps[step] = {**common, "Encoder_output_0": hidden, "Head_input_0": hidden.copy()}
        data_steps[step] = {**common, "Encoder_output_0": hidden, "Head_input_0": rng.normal(size=(64, 4)) * 0.05}
    assert first_firing(evaluate_rule(write_run(tmp_path / "chained", steps), "NotNormalizedData")) is None
    fired = next(r for r in evaluate_rule(write_run(tmp_path / "data", data_steps), "NotNormalizedData") if r.fired)
    assert fired.details["tensor"] == "Head_input_0"


@pytest.mark.parametrize("seed", SEEDS)
def test_check_input_images_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    offsets = rng.choice([0.0, 0.1, 0.3, -0.5], size=3)
    batches = [rng.normal(size=(100, 3, 5, 5)) * 0.3 + offsets[None, :, None, None] for _ in range(8)]
    expected = None
    for step in range(8):
        seen = np.concatenate(batches[: step + 1])
        if len(seen) >= 500 and np.any(np.abs(seen.mean(axis=(0, 2, 3))) > 0.2):
            expected = step
            break
    assert first_firing(evaluate_rule(model_run(tmp_path, "run", batches), sagemaker("CheckInputImages"))) == expected


def test_check_input_images_channel_and_regex_parameters(tmp_path):
    rng = np.random.default_rng(1)
    nhwc = [rng.normal(size=(10, 4, 4, 3)) + np.array([0.0, 0.0, 0.5]) for _ in range(3)]
    path = write_run(tmp_path / "run", {s: {"hybridsequential0_input_0": b} for s, b in enumerate(nhwc)})
    spec = RuleSpec("CheckInputImages", {"channel": "3", "threshold_samples": "20"})
    result = next(r for r in evaluate_rule(path, sagemaker(spec)) if r.fired)
    assert result.step == 1 and result.details["channel"] == 2
    assert (
        first_firing(
            evaluate_rule(path, sagemaker(RuleSpec("CheckInputImages", {"channel": "1", "threshold_samples": "20"})))
        )
        is None
    )


# -- NLPSequenceRatio -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_nlp_sequence_ratio_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    tokens, thresholds = [0, 1], [50.0, 20.0]
    steps, expected = {}, []
    for step in range(6):
        batch = rng.integers(2, 100, size=(8, 20))
        batch[rng.random(batch.shape) < rng.choice([0.1, 0.6])] = 0
        batch[rng.random(batch.shape) < rng.choice([0.05, 0.3])] = 1
        steps[step] = {"embedding_input_0": batch, "CrossEntropyLoss_input_1": np.zeros(8, dtype=np.int64)}
        if any(100.0 * np.mean(batch == t) > p for t, p in zip(tokens, thresholds, strict=False)):
            expected.append(step)
    path = write_run(tmp_path / "run", steps, collections={"labels": ["CrossEntropyLoss_input_1"]})
    spec = RuleSpec("NLPSequenceRatio", {"token_values": "0;1", "token_thresholds_percent": "50;20"})
    results = evaluate_rule(path, sagemaker(spec))
    assert fired_steps(results) == expected
    assert all(r.details.get("tensor", "embedding_input_0") == "embedding_input_0" for r in results)


def test_nlp_sequence_ratio_parameters(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", {0: {"x": np.ones(2)}}))
    rule = create_rule(trial, RuleSpec("NLPSequenceRatio", {"token_values": "0,3", "token_thresholds_percent": "40"}))
    assert rule.tokens == [0, 3] and rule.thresholds == [40.0, 40.0]
    with pytest.raises(ConfigError, match="2 token_values but 3"):
        create_rule(trial, RuleSpec("NLPSequenceRatio", {"token_values": "0,3", "token_thresholds_percent": "1,2,3"}))
    with pytest.raises(ConfigError, match="must be numbers"):
        create_rule(trial, RuleSpec("NLPSequenceRatio", {"token_values": "pad"}))


# -- robustness -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", MY_RULES)
def test_rules_survive_nan_empty_and_missing_tensors_on_a_live_run(tmp_path, rule):
    weird = {
        0: {
            "fc.weight": np.full((2, 2), np.nan),
            "gradient/fc.weight": np.zeros((0,)),
            "1_output_0": np.zeros((0, 3)),
            "Net_input_0": np.full((4, 3, 2, 2), np.inf),
            "CrossEntropyLoss_output_0": np.array([np.nan]),
        },
        1: {"fc.weight": np.zeros((0,)), "1_input_0": np.array([np.nan, 1.0])},
        2: {
            "gradient/fc.weight": np.full(3, np.nan),
            "Net_fc.weight": np.ones(1),
            "embedding_input_0": np.zeros((0, 4), np.int64),
        },
    }
    path = write_run(
        tmp_path / "run",
        weird,
        collections={"relu_output": ["1_output_0"], "relu_input": ["1_input_0"]},
        finished=False,
    )
    trial = create_trial(path)
    created = create_rule(trial, rule)
    results = [created.evaluate(step) for step in (0, 1, 2)]
    assert created.evaluate(7) is None  # a step not written yet: nothing to say
    assert all(result is None or result.rule == rule for result in results)
    for result in results:
        if result is not None:
            json.dumps(result.to_dict())  # what a rule runner writes to rule-output/<name>.json


def test_class_imbalance_does_not_judge_regression_targets(tmp_path):
    """MSE regression: the loss's inputs are real-valued predictions and targets, not class ids."""
    rng = np.random.default_rng(0)
    steps = {
        s: {"MSELoss_input_0": rng.normal(size=64), "MSELoss_input_1": rng.normal(size=64) * 3 + 1} for s in range(20)
    }
    path = write_run(
        tmp_path / "regression",
        steps,
        collections={"predictions": ["MSELoss_input_0"], "labels": ["MSELoss_input_1"]},
    )
    results = evaluate_rule(path, "ClassImbalance:samples=100")
    assert not any(r.fired for r in results)
    assert results[-1].not_evaluated and "not class ids" in results[-1].message
    # the same run with integer class labels is judged
    for s in steps:
        steps[s]["MSELoss_input_1"] = np.where(rng.random(64) < 0.97, 0.0, 1.0)
    path = write_run(
        tmp_path / "classes",
        steps,
        collections={"predictions": ["MSELoss_input_0"], "labels": ["MSELoss_input_1"]},
    )
    assert first_firing(evaluate_rule(path, "ClassImbalance:samples=100")) is not None
