"""Oracle tests for the gradient, weight and activation rules.

Each test writes a synthetic run (real event files, via tests/rules/synthetic.py) from random
arrays and compares the rule's verdict at every step with a plain-numpy oracle of the rule's
documented formula (the module docstrings).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule
from trainguard.trial import create_trial

SEEDS = range(5)


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


# -- VanishingGradient ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_vanishing_gradient_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    threshold = float(10 ** rng.uniform(-8, -6))
    steps, expected = {}, []
    for step in range(8):
        tensors = {f"gradient/layer{i}.weight": rng.normal(size=(4, 5)) * 10 ** rng.uniform(-9, -4) for i in range(3)}
        steps[step] = tensors
        if any(np.mean(np.abs(g)) < threshold for g in tensors.values()):
            expected.append(step)
    path = write_run(tmp_path / "run", steps)
    results = evaluate_rule(path, sagemaker(RuleSpec("VanishingGradient", {"threshold": repr(threshold)})))
    assert [r.step for r in results] == list(range(8))
    assert fired_steps(results) == expected
    for result in results:
        if result.fired:
            assert np.mean(np.abs(steps[result.step][result.details["tensor"]])) < threshold


def test_vanishing_gradient_skips_non_finite_and_reports_missing_gradients(tmp_path):
    path = write_run(tmp_path / "run", {0: {"gradient/w": np.full(3, np.nan)}, 1: {"gradient/w": np.zeros(3)}})
    assert fired_steps(evaluate_rule(path, sagemaker("VanishingGradient"))) == [1]
    no_gradients = write_run(tmp_path / "weights-only", {0: {"net.weight": np.ones(3)}})
    result, final = evaluate_rule(no_gradients, sagemaker("VanishingGradient"))
    assert not result.fired and result.missing and result.missing[0].collection == "gradients"
    assert not final.fired and final.not_evaluated and final.message.startswith("RuleNotEvaluated: no gradients")


# -- ExplodingTensor ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("only_nan", [False, True])
def test_exploding_tensor_matches_oracle(tmp_path, seed, only_nan):
    rng = np.random.default_rng(seed)
    steps, expected = {}, []
    for step in range(10):
        tensors = {"a.weight": rng.normal(size=(3, 3)), "b_output_0": rng.normal(size=6), "ids": np.arange(4)}
        fault = rng.choice(["none", "nan", "inf"], p=[0.6, 0.2, 0.2])
        if fault != "none":
            target = tensors["a.weight" if rng.random() < 0.5 else "b_output_0"].reshape(-1)
            target[rng.integers(target.size)] = np.nan if fault == "nan" else -np.inf
        steps[step] = tensors
        values = [t for t in tensors.values() if t.dtype.kind == "f"]
        if any(np.isnan(t).any() or (not only_nan and np.isinf(t).any()) for t in values):
            expected.append(step)
    path = write_run(tmp_path / "run", steps)
    results = evaluate_rule(path, sagemaker(RuleSpec("ExplodingTensor", {"only_nan": str(only_nan)})))
    assert fired_steps(results) == expected


def test_exploding_tensor_selection_is_union_of_collections_and_regex(tmp_path):
    steps = {
        0: {"gradient/w": np.array([np.inf]), "x.weight": np.ones(2)},
        1: {"gradient/w": np.ones(1), "x.weight": np.array([np.nan])},
    }
    path = write_run(tmp_path / "run", steps)
    assert fired_steps(
        evaluate_rule(path, sagemaker(RuleSpec("ExplodingTensor", {"collection_names": "gradients"})))
    ) == [0]
    assert fired_steps(evaluate_rule(path, sagemaker(RuleSpec("ExplodingTensor", {"tensor_regex": "x\\..*"})))) == [1]
    assert fired_steps(
        evaluate_rule(
            path, sagemaker(RuleSpec("ExplodingTensor", {"collection_names": "gradients", "tensor_regex": "x\\..*"}))
        )
    ) == [0, 1]



def test_exploding_tensor_reads_no_replica_fingerprint_rows(tmp_path):
    # a fingerprint row of an earlier version holds NaN where a parameter has no gradient:
    # bookkeeping of the run, not a value that exploded; a NaN of the model's is still found
    row = np.array([[1.5e15, np.nan, 4.0, 8.0], [-1.0, np.nan, np.nan, 0.0]])
    steps = {
        0: {"replica_fingerprint/gradients": row, "replica_fingerprint/parameters": row, "x.weight": np.ones(2)},
        1: {"replica_fingerprint/gradients": row, "x.weight": np.array([np.nan, 1.0])},
    }
    path = write_run(tmp_path / "run", steps, collections={"replica_fingerprints": list(steps[0])[:2]})
    assert fired_steps(evaluate_rule(path, sagemaker(RuleSpec("ExplodingTensor")))) == [1]

# -- DeadRelu and SaturatedActivation ---------------------------------------------------------------


def node_activity(array, active):
    """Oracle: percent of samples in which each node (axis 1 of 2-D, channel of 4-D) is active."""
    if array.ndim == 4:
        array = np.moveaxis(array, 1, -1).reshape(-1, array.shape[1])
    return 100.0 * np.mean(active(array), axis=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("patience", [1, 3])
def test_dead_relu_matches_oracle(tmp_path, seed, patience):
    rng = np.random.default_rng(seed)
    steps, expected, streak = {}, [], {}
    layer_layout = {"1_output_0": (16, 12), "features.3_output_0": (4, 6, 5, 5)}
    for step in range(8):
        tensors = {}
        for name, shape in layer_layout.items():
            dead_fraction = rng.choice([0.0, 0.3, 0.7, 1.0])
            nodes = shape[1]
            offsets = np.where(rng.random(nodes) < dead_fraction, -50.0, 0.5)
            offsets = offsets.reshape((1, nodes) + (1,) * (len(shape) - 2))
            tensors[name] = np.maximum(rng.normal(size=shape) + offsets, 0.0)
        steps[step] = tensors
        fired = False
        for name, value in tensors.items():
            dead = 100.0 * np.mean(node_activity(value, lambda a: a > 0) < 1.0)
            streak[name] = streak.get(name, 0) + 1 if dead > 50.0 else 0
            fired = fired or streak[name] >= patience
        if fired:
            expected.append(step)
    path = write_run(tmp_path / "run", steps, collections={"relu_output": list(layer_layout)})
    results = evaluate_rule(path, sagemaker(RuleSpec("DeadRelu", {"patience": str(patience)})))
    assert fired_steps(results) == expected


def test_dead_relu_finds_tensors_by_collection_and_by_sagemaker_regex(tmp_path):
    dead = np.zeros((8, 4))
    by_collection = write_run(
        tmp_path / "a", {s: {"1_output_0": dead} for s in range(3)}, collections={"relu_output": ["1_output_0"]}
    )
    by_name = write_run(tmp_path / "b", {s: {"dense0_relu_output": dead} for s in range(3)})
    unrelated = write_run(tmp_path / "c", {s: {"1_output_0": dead, "w.weight": np.ones(2)} for s in range(3)})
    assert first_firing(evaluate_rule(by_collection, sagemaker("DeadRelu"))) == 0
    assert first_firing(evaluate_rule(by_collection, sagemaker("DeadRelu:patience=3"))) == 2
    assert first_firing(evaluate_rule(by_name, sagemaker("DeadRelu"))) == 0
    results = evaluate_rule(unrelated, sagemaker("DeadRelu"))
    assert not any(r.fired for r in results) and results[-2].missing and results[-1].not_evaluated


@pytest.mark.parametrize("seed", SEEDS)
def test_saturated_activation_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    bounds = {"tanh": (-9.4999, 9.4999), "sigmoid": (-23.0, 16.99999)}
    names = {"3_input_0": "tanh", "5_input_0": "sigmoid", "encoder.tanh_input": "tanh"}
    steps, expected = {}, []
    for step in range(6):
        tensors = {}
        fired = False
        for name, kind in names.items():
            nodes = 10
            offsets = np.where(rng.random(nodes) < rng.choice([0.2, 0.6, 0.9]), rng.choice([-60.0, 60.0], nodes), 0.0)
            value = rng.normal(size=(20, nodes)) * 2 + offsets
            tensors[name] = value
            low, high = bounds[kind]
            activity = node_activity(value, lambda a, low=low, high=high: (a > low) & (a < high))
            saturated = 100.0 * np.mean(activity < 1.0)
            fired = fired or saturated > 50.0
        steps[step] = tensors
        if fired:
            expected.append(step)
    path = write_run(tmp_path / "run", steps, collections={"tanh_input": ["3_input_0"], "sigmoid_input": ["5_input_0"]})
    assert fired_steps(evaluate_rule(path, sagemaker("SaturatedActivation"))) == expected


def test_saturated_activation_uses_the_sigmoid_bounds_for_sigmoid_inputs(tmp_path):
    # 12 is saturated for tanh (|x| > 9.4999) but inside the sigmoid's (-23, 17)
    value = np.full((10, 4), 12.0)
    as_sigmoid = write_run(tmp_path / "s", {0: {"2_input_0": value}}, collections={"sigmoid_input": ["2_input_0"]})
    as_tanh = write_run(tmp_path / "t", {0: {"2_input_0": value}}, collections={"tanh_input": ["2_input_0"]})
    assert first_firing(evaluate_rule(as_sigmoid, sagemaker("SaturatedActivation"))) is None
    assert first_firing(evaluate_rule(as_tanh, sagemaker("SaturatedActivation"))) == 0
    custom = RuleSpec("SaturatedActivation", {"threshold_sigmoid_max": "10", "threshold_layer": "99"})
    assert first_firing(evaluate_rule(as_sigmoid, sagemaker(custom))) == 0


# -- WeightUpdateRatio ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_steps", [None, 2])
def test_weight_update_ratio_matches_oracle(tmp_path, seed, num_steps):
    rng = np.random.default_rng(seed)
    large, small, eps = 10.0, 1e-8, 1e-9
    weights = {"fc1.weight": rng.normal(size=(5, 4)), "fc2.weight": rng.normal(size=(3, 5))}
    steps, history, modes = {}, [], {}
    global_step = 0
    for train_step in range(9):
        for name in weights:
            scale = rng.choice([0.0, 1e-3, 50.0], p=[0.15, 0.7, 0.15])
            weights[name] = weights[name] + scale * rng.normal(size=weights[name].shape)
        steps[global_step] = {name: value.copy() for name, value in weights.items()}
        modes[global_step] = "TRAIN"
        history.append(global_step)
        global_step += 1
        if train_step % 4 == 3:  # an EVAL step in between: weights equal, never judged
            steps[global_step] = {name: value.copy() for name, value in weights.items()}
            modes[global_step] = "EVAL"
            global_step += 1
    expected = []
    for index, step in enumerate(history):
        if index == 0:
            continue
        prev_index = index - 1 if num_steps is None else max(0, index - num_steps)
        prev = history[prev_index]
        ratios = [
            np.linalg.norm(steps[step][n] - steps[prev][n]) / (np.linalg.norm(steps[prev][n]) + eps) for n in weights
        ]
        if any(r > large or r < small for r in ratios):
            expected.append(step)
    path = write_run(tmp_path / "run", steps, modes=modes)
    spec = RuleSpec("WeightUpdateRatio", {} if num_steps is None else {"num_steps": str(num_steps)})
    results = evaluate_rule(path, sagemaker(spec))
    assert fired_steps(results) == expected
    assert all(modes[r.step] == "TRAIN" for r in results)


def test_weight_update_ratio_hints_differ_for_large_and_small(tmp_path):
    w = np.ones((3, 3))
    frozen = write_run(tmp_path / "frozen", {0: {"fc.weight": w}, 1: {"fc.weight": w}})
    jumped = write_run(tmp_path / "jump", {0: {"fc.weight": w}, 1: {"fc.weight": w * 100}})
    exploded = write_run(tmp_path / "nan", {0: {"fc.weight": w}, 1: {"fc.weight": w * np.nan}})
    results = {}
    for framework in ("pytorch", "keras", "xgboost", None):
        for name, path in (("small", frozen), ("large", jumped), ("nan", exploded)):
            trial = create_trial(path)
            trial._framework = framework  # what the run's collections file would say (Trial.framework)
            (results[framework, name],) = evaluate_rule(trial, sagemaker("WeightUpdateRatio"))
    small, large, nan = (results["pytorch", name] for name in ("small", "large", "nan"))
    assert small.fired and small.details["direction"] == "small" and "requires_grad" in small.fix_hint
    assert large.fired and large.details["direction"] == "large" and "clip_grad_norm_" in large.fix_hint
    assert nan.fired and nan.details["ratio"] == float("inf")
    # PyTorch's API is never advised to Keras or XGBoost users, nor to a run of unknown framework
    for framework in ("keras", "xgboost", None):
        for name in ("small", "large", "nan"):
            hint = results[framework, name].fix_hint
            assert hint and "clip_grad_norm_" not in hint and "requires_grad" not in hint, (framework, hint)
    assert "clipnorm" in results["keras", "large"].fix_hint and "eta" in results["xgboost", "large"].fix_hint


# -- PoorWeightInitialization ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_poor_weight_initialization_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    threshold, spread_min, patience, horizon, tolerance = 1000.0, 1e-8, 5, 10, 1e-3
    steps, expected, losses = {}, [], []
    stuck = rng.random() < 0.5
    for step in range(14):
        relu_in = {f"{i}_input_0": rng.normal(size=(8, 6)) * 10 ** rng.uniform(-2.2, 0.2) for i in (1, 3)}
        grads = {
            "gradient/fc.weight": rng.normal(size=(6, 6)) * (0.0 if rng.random() < 0.15 else 1e-3),
            "gradient/fc.bias": np.zeros(6),
        }  # too small to judge
        loss = 1.3863 if stuck else 1.4 - 0.01 * step + rng.normal() * 0.02
        steps[step] = {**relu_in, **grads, "CrossEntropyLoss_output_0": np.array([loss])}
        if step > horizon:
            continue
        variances = [np.var(v) for v in relu_in.values()]
        fired = max(variances) / min(variances) > threshold
        g = grads["gradient/fc.weight"]
        fired = fired or np.subtract(*np.percentile(g, [95, 5])) < spread_min
        losses.append(loss)
        recent = losses[-patience:]
        fired = fired or (len(recent) == patience and (max(recent) - min(recent)) / abs(np.mean(recent)) < tolerance)
        if fired:
            expected.append(step)
    path = write_run(tmp_path / "run", steps, collections={"relu_input": ["1_input_0", "3_input_0"]})
    results = evaluate_rule(path, sagemaker("PoorWeightInitialization"))
    assert fired_steps(results) == expected
    assert max(r.step for r in results) == horizon  # only the first `steps` steps are analysed


# -- parameters as SageMaker sends them -----------------------------------------------------------


def test_parameters_parse_from_sagemaker_strings(tmp_path):
    trial = create_trial(write_run(tmp_path / "run", {0: {"gradient/w": np.ones(2)}}))
    rule = create_rule(
        trial, RuleSpec("WeightUpdateRatio", {"num_steps": "None", "large_threshold": "5", "epsilon": "1e-6"})
    )
    assert rule.num_steps is None and rule.large_threshold == 5.0 and rule.epsilon == 1e-6
    rule = create_rule(
        trial, RuleSpec("ExplodingTensor", {"only_nan": "True", "collection_names": "gradients,weights"})
    )
    assert rule.only_nan is True and rule.collection_names == ["gradients", "weights"]
    rule = create_rule(trial, "DeadRelu:tensor_regex=None,threshold_layer=75")
    assert rule.tensor_regex is None and rule.threshold_layer == 75.0
    rule = create_rule(
        trial, RuleSpec("PoorWeightInitialization", {"activation_inputs_regex": ".*relu_input", "steps": "20"})
    )
    assert rule.activation_inputs_regex == [".*relu_input"] and rule.steps == 20
    assert create_rule(trial, "SaturatedActivation").threshold_tanh_max == 9.4999
    with pytest.raises(ConfigError, match="threshold_tanh_min"):
        create_rule(trial, RuleSpec("SaturatedActivation", {"threshold_tanh_min": "10"}))
    with pytest.raises(ConfigError, match="threshold=.abc. is not a valid float"):
        create_rule(trial, "VanishingGradient:threshold=abc")
    with pytest.raises(ConfigError, match="threshold_layer"):
        create_rule(trial, "DeadRelu:threshold_layer=150")
    with pytest.raises(ConfigError, match="small_threshold"):
        create_rule(trial, "WeightUpdateRatio:small_threshold=100")
    with pytest.raises(ConfigError, match="unknown parameter"):
        create_rule(trial, "VanishingGradient:treshold=1")
    with pytest.raises(ConfigError, match="regular expression|regex"):
        create_rule(trial, RuleSpec("ExplodingTensor", {"tensor_regex": "(unclosed"}))


def test_exploding_tensor_reads_an_input_of_zeros_and_minus_inf_as_an_attention_mask(tmp_path):
    # a causal mask as nn.Transformer.generate_square_subsequent_mask builds it: 0 on and below the diagonal
    mask = np.triu(np.full((4, 4), -np.inf), k=1)
    mask[np.tril_indices(4)] = 0.0
    log_of_saturated_softmax = mask.copy()  # the same values as a layer output are a real overflow
    steps = {
        0: {"Net_input_0": np.ones((2, 4)), "Net_input_1": mask, "net.weight": np.ones(3)},
        1: {"Net_input_0": np.ones((2, 4)), "Net_input_1": mask, "attn_output_0": log_of_saturated_softmax},
        2: {"Net_input_0": np.ones((2, 4)), "Net_input_1": np.where(mask == 0, 0.5, -np.inf), "net.weight": np.ones(3)},
        3: {"Net_input_0": np.ones((2, 4)), "encoder_input_1": mask, "net.weight": np.ones(3)},  # passed on to a layer
    }
    path = write_run(tmp_path / "run", steps, collections={"model_inputs": ["Net_input_0", "Net_input_1"]})
    # step 1: the layer output is reported; step 2: an input with -inf beside non-zero values is data, reported
    assert fired_steps(evaluate_rule(path, sagemaker("ExplodingTensor"))) == [1, 2]
