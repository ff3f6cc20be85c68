"""Calibrated semantics of the tensor-state rules: persistence, and gradients zero by construction.

Two kinds of tests: synthetic runs (numpy) that pin the persistence window exactly, and small real
PyTorch runs (CPU, under a second each) of the healthy programs that used to raise false alarms
(an attention model's key bias, a frozen first layer, batch size 1 with all-zero rows, a
multi-label net) and of planted faults (deep sigmoid, zero init, negative ReLU bias, a huge
learning rate, learning rate 0, an optimizer built over a copy of the model). Healthy runs must stay silent
under the default (calibrated) semantics; planted faults must fire their rule.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.rules import RuleSpec, create_rule
from trainguard.trial import create_trial

TENSOR_STATE_RULES = (
    "VanishingGradient",
    "ExplodingTensor",
    "AllZero",
    "UnchangedTensor",
    "WeightUpdateRatio",
    "DeadRelu",
    "SaturatedActivation",
    "PoorWeightInitialization",
)


def fired(results):
    return [result for result in results if result.fired]


# -- persistence on synthetic runs ------------------------------------------------------------------


def _gradients(step_values):
    return {
        step: {"gradient/a.weight": np.full((4, 4), a), "gradient/b.weight": np.full((4, 4), b)}
        for step, (a, b) in enumerate(step_values)
    }


def test_a_single_vanished_step_never_fires_and_a_persistent_one_does(tmp_path):
    healthy, tiny = 1e-3, 1e-10
    blip = write_run(tmp_path / "blip", _gradients([(healthy, healthy), (tiny, tiny)] + [(healthy, healthy)] * 6))
    assert fired(evaluate_rule(blip, "VanishingGradient")) == []
    assert first_firing(evaluate_rule(blip, "VanishingGradient:semantics=sagemaker")) == 1
    # vanished from step 2 on: fires once it held at 3 of the last 5 steps, certain after 5 of 5
    lasting = write_run(tmp_path / "lasting", _gradients([(healthy, healthy)] * 2 + [(tiny, healthy)] * 8))
    results = {r.step: r for r in evaluate_rule(lasting, "VanishingGradient")}
    assert [s for s, r in results.items() if r.fired] == list(range(4, 10))
    assert [s for s, r in results.items() if r.certain] == list(range(6, 10))
    assert "at 3 of the last 5 evaluated steps" in results[4].message
    # every gradient tiny: the loss is flat (a memorised training set), not a gradient-flow problem
    converged = write_run(tmp_path / "converged", _gradients([(tiny, tiny * 50)] * 10))
    assert fired(evaluate_rule(converged, "VanishingGradient")) == []
    assert first_firing(evaluate_rule(converged, "VanishingGradient:semantics=sagemaker")) == 0


def test_non_finite_values_are_immediate_and_certain(tmp_path):
    steps = {s: {"gradient/a.weight": np.ones(3) * (np.nan if s == 2 else 1.0)} for s in range(4)}
    results = evaluate_rule(write_run(tmp_path / "run", steps), "ExplodingTensor")
    (finding,) = fired(results)
    assert finding.step == 2 and finding.certain


def test_zero_by_construction_gradients_are_not_judged(tmp_path):
    """Key bias ~1e-10 (softmax shift invariance) and a weight gradient zero while its bias
    gradient is not (all-zero inputs): neither vanished, nor all zero."""
    rng = np.random.default_rng(0)
    steps = {}
    for step in range(10):
        steps[step] = {
            "gradient/encoder.attention.self.key.bias": rng.normal(size=8) * 1e-10,
            "gradient/encoder.attention.self.key.weight": rng.normal(size=(8, 8)) * 1e-3,
            "gradient/fc1.weight": np.zeros((8, 4)),  # the batch's input row was all zero
            "gradient/fc1.bias": rng.normal(size=8) * 1e-3,
            "gradient/fc2.weight": rng.normal(size=(3, 8)) * 1e-3,
            "gradient/fc2.bias": rng.normal(size=3) * 1e-3,
        }
    path = write_run(tmp_path / "run", steps)
    for rule in ("VanishingGradient", "AllZero", "PoorWeightInitialization"):
        assert fired(evaluate_rule(path, rule)) == [], rule
        # the same run under SageMaker's single-step conditions: the false alarms this avoids
        assert fired(evaluate_rule(path, f"{rule}:semantics=sagemaker")), rule


def test_a_bias_that_cancels_out_of_the_loss_is_not_all_zero(tmp_path):
    """A siamese net compares the embeddings of two passes, |f(x1) - f(x2)|: the last embedding
    layer's bias cancels, so autograd gives it an exactly-zero gradient while its weight's is not
    (checked on a real torch layer). AllZero does not call that bias's gradient all zero; a layer
    whose weight gradient is zero too (dead, or saturated behind) is still reported."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 4)
    x1, x2 = torch.randn(8, 6), torch.randn(8, 6)
    torch.abs(layer(x1) - layer(x2)).sum().backward()
    assert not torch.any(layer.bias.grad) and torch.any(layer.weight.grad)

    rng = np.random.default_rng(0)
    steps = {}
    for step in range(10):
        steps[step] = {
            "gradient/SiameseNetwork_cnn.7.weight": rng.normal(size=(4, 6)) * 1e-2,
            "gradient/SiameseNetwork_cnn.7.bias": np.zeros(4),
            "gradient/SiameseNetwork_fc.0.weight": rng.normal(size=(3, 4)) * 1e-2,
            "gradient/SiameseNetwork_fc.0.bias": rng.normal(size=3) * 1e-2,
        }
    path = write_run(tmp_path / "siamese", steps)
    assert fired(evaluate_rule(path, "AllZero")) == []
    assert fired(evaluate_rule(path, "AllZero:semantics=sagemaker"))
    for step in range(3, 10):  # from step 3 the head is dead: weight and bias gradients all zero
        steps[step]["gradient/SiameseNetwork_fc.0.weight"] = np.zeros((3, 4))
        steps[step]["gradient/SiameseNetwork_fc.0.bias"] = np.zeros(3)
    results = fired(evaluate_rule(write_run(tmp_path / "dead-head", steps), "AllZero"))
    assert results and results[0].step == 5
    assert set(results[0].details["tensors"]) == {
        "gradient/SiameseNetwork_fc.0.weight", "gradient/SiameseNetwork_fc.0.bias"
    }  # fmt: skip


def test_frozen_parameters_are_excused_unless_nothing_learns(tmp_path):
    rng = np.random.default_rng(2)
    frozen = rng.normal(size=(4, 4))
    fine_tuned = {
        s: {
            "body.weight": frozen,
            "head.weight": rng.normal(size=(2, 4)),
            "gradient/head.weight": rng.normal(size=(2, 4)),
        }
        for s in range(8)
    }  # body frozen (no gradient saved), head trained
    path = write_run(tmp_path / "fine-tune", fine_tuned)
    for rule in ("UnchangedTensor", "WeightUpdateRatio"):
        assert fired(evaluate_rule(path, rule)) == [], rule
        assert fired(evaluate_rule(path, f"{rule}:semantics=sagemaker")), rule
    nothing = {
        s: {"body.weight": frozen, "head.weight": np.ones((2, 4)), "gradient/other": np.ones(2) * s} for s in range(8)
    }
    path = write_run(tmp_path / "frozen-all", nothing)
    for rule in ("UnchangedTensor", "WeightUpdateRatio"):
        assert first_firing(evaluate_rule(path, rule)) is not None, rule


def test_a_weight_unchanged_because_its_inputs_were_zero_is_not_a_fault(tmp_path):
    """Batch size 1, SGD: fc1's weight stays the same while the input rows are all zero (its
    gradient is zero at those steps, not at the next one); lr 0 keeps it the same despite a
    gradient: that fires at the first evaluation of 3 saved steps."""
    rng = np.random.default_rng(4)
    w, steps = rng.normal(size=(8, 4)), {}
    for step in range(8):
        zero_input = step in (2, 3, 4)  # no update after steps 2, 3, 4: w equal at steps 2 to 5
        gradient = np.zeros((8, 4)) if zero_input else rng.normal(size=(8, 4)) * 1e-2
        steps[step] = {
            "fc1.weight": w.copy(),
            "fc2.weight": rng.normal(size=(3, 8)),  # the rest of the model trains
            "gradient/fc1.weight": gradient,
            "gradient/fc1.bias": rng.normal(size=8) * 1e-2,
            "gradient/fc2.weight": rng.normal(size=(3, 8)) * 1e-2,
        }
        w = w - 0.1 * gradient
    path = write_run(tmp_path / "zero-rows", steps)
    assert fired(evaluate_rule(path, "UnchangedTensor")) == []
    assert first_firing(evaluate_rule(path, "UnchangedTensor:semantics=sagemaker")) == 4
    for step in steps:  # now a non-zero gradient every step that is never applied (lr 0)
        steps[step]["gradient/fc1.weight"] = rng.normal(size=(8, 4)) * 1e-2
        steps[step]["fc1.weight"] = steps[0]["fc1.weight"]
    path = write_run(tmp_path / "lr-zero", steps)
    results = evaluate_rule(path, "UnchangedTensor")
    assert first_firing(results) == 2 and fired(results)[0].details["tensor"] == "fc1.weight"
    assert [r.certain for r in fired(results)] == [False] * 4 + [True] * 2


def test_a_zero_initialised_weight_has_no_update_ratio(tmp_path):
    """LoRA's B matrix starts at zero and grows: any update is "infinitely" large relative to 0."""
    rng = np.random.default_rng(5)
    steps = {s: {"lora_B.weight": np.full((8, 2), 1e-3 * s), "base.weight": rng.normal(size=(8, 8))} for s in range(8)}
    path = write_run(tmp_path / "lora", steps)
    assert fired(evaluate_rule(path, "WeightUpdateRatio")) == []
    assert fired(evaluate_rule(path, "WeightUpdateRatio:semantics=sagemaker"))[0].details["tensor"] == "lora_B.weight"


def test_binary_indicator_inputs_are_not_unnormalised(tmp_path):
    rng = np.random.default_rng(3)
    multi_hot = {
        s: {"Net_input_0": (rng.random((32, 20)) < 0.03).astype(np.float32), "Net_fc.weight": np.ones(2)}
        for s in range(6)
    }
    path = write_run(tmp_path / "multi-hot", multi_hot, collections={"weights": ["Net_fc.weight"]})
    assert fired(evaluate_rule(path, "NotNormalizedData")) == []
    zeros = {s: {"Net_input_0": np.zeros((32, 20), dtype=np.float32), "Net_fc.weight": np.ones(2)} for s in range(6)}
    path = write_run(tmp_path / "zeros", zeros, collections={"weights": ["Net_fc.weight"]})
    # no indicators: 128 samples (4 batches) of nothing but zeros carry no information
    assert "every value of the last 128 samples is 0" in fired(evaluate_rule(path, "NotNormalizedData"))[0].message
    squashed = {s: {"Net_input_0": rng.normal(size=(32, 20)) * 0.05, "Net_fc.weight": np.ones(2)} for s in range(6)}
    path = write_run(tmp_path / "squashed", squashed, collections={"weights": ["Net_fc.weight"]})
    assert fired(evaluate_rule(path, "NotNormalizedData"))


def test_inputs_turning_all_zero_mid_run_are_found_behind_the_healthy_start(tmp_path):
    # 40 steps of standardised inputs, then all zeros (a broken pipeline, the detection corpus'
    # fault-zero-inputs-midrun): the statistics since the start still look normalised (pooled std
    # ~0.6), the last 100 samples are all 0. Batches with some all-zero rows stay silent.
    rng = np.random.default_rng(5)
    weight = {"Net_fc.weight": np.ones(2)}
    steps = {s: {"Net_input_0": rng.normal(size=(8, 10)) if s < 40 else np.zeros((8, 10)), **weight} for s in range(60)}
    path = write_run(tmp_path / "midrun", steps, collections={"weights": ["Net_fc.weight"]})
    first = fired(evaluate_rule(path, "NotNormalizedData"))[0]
    assert first.step == 52 and "every value of the last 104 samples is 0" in first.message  # 13 batches of 8
    rows = {s: {"Net_input_0": rng.normal(size=(8, 10)) * (rng.random((8, 1)) < 0.7), **weight} for s in range(60)}
    path = write_run(tmp_path / "zero-rows", rows, collections={"weights": ["Net_fc.weight"]})
    assert fired(evaluate_rule(path, "NotNormalizedData")) == []


def test_not_evaluated_when_the_rule_never_had_its_data(tmp_path):
    path = write_run(tmp_path / "run", {s: {"loss": np.array([1.0])} for s in range(3)})
    for rule in ("VanishingGradient", "DeadRelu", "SaturatedActivation", "WeightUpdateRatio"):
        final = evaluate_rule(path, rule)[-1]
        assert final.not_evaluated and final.message.startswith("RuleNotEvaluated: "), rule
        assert not final.fired


def test_dead_relu_pools_a_window_of_batches_and_calls_nan_non_finite(tmp_path):
    rng = np.random.default_rng(1)
    # batch size 1: each step about half the nodes are off, but no node is off for every sample
    single = {s: {"1_output_0": np.maximum(rng.normal(size=(1, 32)), 0.0)} for s in range(12)}
    path = write_run(tmp_path / "single", single, collections={"relu_output": ["1_output_0"]})
    assert fired(evaluate_rule(path, "DeadRelu")) == []
    dead = {s: {"1_output_0": np.zeros((16, 32))} for s in range(6)}
    path = write_run(tmp_path / "dead", dead, collections={"relu_output": ["1_output_0"]})
    assert first_firing(evaluate_rule(path, "DeadRelu")) == 2
    nan = {s: {"1_output_0": np.full((16, 32), np.nan)} for s in range(6)}
    path = write_run(tmp_path / "nan", nan, collections={"relu_output": ["1_output_0"]})
    results = evaluate_rule(path, "DeadRelu")
    assert fired(results) == [] and "non-finite" in results[0].message


def test_semantics_parameter_is_validated_and_defaults_to_calibrated(tmp_path):
    from trainguard.errors import ConfigError

    trial = create_trial(write_run(tmp_path / "run", {0: {"gradient/w": np.ones(2)}}))
    assert create_rule(trial, "VanishingGradient").semantics == "calibrated"
    assert create_rule(trial, "DeadRelu").threshold_layer == 90.0
    assert create_rule(trial, "DeadRelu:semantics=sagemaker").threshold_layer == 50.0  # documented
    assert (
        create_rule(trial, RuleSpec("DeadRelu", {"semantics": "sagemaker", "threshold_layer": "70"})).threshold_layer
        == 70
    )
    with pytest.raises(ConfigError, match="semantics"):
        create_rule(trial, "AllZero:semantics=strict")
    for rule in TENSOR_STATE_RULES:
        assert create_rule(trial, rule).stop_policy.startswith("stops training"), rule


# -- real PyTorch runs --------------------------------------------------------------------------------


def _train(out_dir, model, batches, *, loss_fn=None, lr=0.05, optimizer="sgd", optimizer_on_a_copy=False):
    """Train ``model`` on ``batches`` [(x, y)] with the trainguard hook saving every step."""
    import copy

    import torch

    import trainguard.pytorch as tg

    loss_fn = loss_fn or torch.nn.CrossEntropyLoss()
    # the bug of building the optimizer over another model's parameters (a copy made before training)
    trained = copy.deepcopy(model) if optimizer_on_a_copy else model
    parameters = [p for p in trained.parameters() if p.requires_grad]
    make = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    opt = make(parameters, lr=lr)
    hook = tg.Hook(
        os.fspath(out_dir),
        save_config=tg.SaveConfig(save_interval=1),
        include_collections=[
            "weights",
            "biases",
            "gradients",
            "losses",
            "inputs",
            "relu_input",
            "relu_output",
            "tanh_input",
            "sigmoid_input",
        ],
    )
    hook.register_module(model)
    hook.register_loss(loss_fn)
    try:
        for x, y in batches:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    finally:
        hook.close()
    return os.fspath(out_dir)


def _classification(rng, steps, batch, features=12, classes=3, zero_rows=0.0):
    import torch

    proto = rng.normal(size=(classes, features))
    batches = []
    for _ in range(steps):
        y = rng.integers(0, classes, size=batch)
        x = proto[y] + rng.normal(size=(batch, features))
        x[rng.random(batch) < zero_rows] = 0.0
        batches.append((torch.tensor(x, dtype=torch.float32), torch.tensor(y)))
    return batches


def _mlp(features=12, hidden=32, classes=3, depth=1, activation=None):
    from torch import nn

    layers, width = [], features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), (activation or nn.ReLU)()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, classes))


class _Attention:
    """A tiny BERT-like classifier: token embedding, one self-attention block with query/key/value
    biases (``attention.self.key.bias``), mean pooling, a linear head."""

    @staticmethod
    def build(vocab=1000, width=16, classes=3, positions=512):
        import torch
        from torch import nn

        class SelfAttention(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))

            def forward(self, h):  # type: ignore[no-untyped-def]
                scores = self.query(h) @ self.key(h).transpose(1, 2) / width**0.5
                return torch.softmax(scores, dim=-1) @ self.value(h)

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.self = SelfAttention()
                self.norm = nn.LayerNorm(width)

            def forward(self, h):  # type: ignore[no-untyped-def]
                return self.norm(h + self.self(h))

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                # as in BERT: most token rows and positions get no gradient in a batch
                self.embeddings = nn.Embedding(vocab, width)
                self.positions = nn.Embedding(positions, width)
                self.attention = Block()
                self.head = nn.Linear(width, classes)

            def forward(self, tokens):  # type: ignore[no-untyped-def]
                where = torch.arange(tokens.shape[1])
                return self.head(self.attention(self.embeddings(tokens) + self.positions(where)).mean(dim=1))

        return Net()

    @staticmethod
    def batches(rng, steps, batch=8, length=10, vocab=40, classes=3):  # tokens < 40 of the 1000
        import torch

        out = []
        for _ in range(steps):
            y = rng.integers(0, classes, size=batch)
            tokens = rng.integers(1, vocab // 2, size=(batch, length)) + (y[:, None] * 5) % (vocab // 2)
            out.append((torch.tensor(tokens), torch.tensor(y)))
        return out


def _run(name, tmp_path):
    """Train the named program; returns its run's path."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    out = tmp_path / name
    steps = 30
    if name == "healthy-attention-key-bias":
        return _train(out, _Attention.build(), _Attention.batches(rng, steps), lr=0.1)
    if name == "healthy-frozen-first-layer":
        model = _mlp(depth=2)
        model[0].requires_grad_(False)
        return _train(out, model, _classification(rng, steps, 16))
    if name == "healthy-batch1-zero-rows":
        return _train(out, _mlp(), _classification(rng, steps, 1, zero_rows=0.5), lr=0.02)
    if name == "healthy-multilabel":
        # sparse multi-hot (bag-of-words) features: σ ≈ 0.17, which a "squashed data" check would flag
        x = (rng.random((steps, 16, 20)) < 0.03).astype(np.float32)
        w = rng.normal(size=(20, 5))
        y = ((x @ w) > 0.1).astype(np.float32)  # several labels per example
        batches = [(torch.tensor(a), torch.tensor(b)) for a, b in zip(x, y, strict=True)]
        return _train(out, _mlp(20, 32, 5), batches, loss_fn=torch.nn.BCEWithLogitsLoss(), optimizer="adam", lr=0.01)
    if name == "deep-sigmoid":
        return _train(out, _mlp(depth=10, activation=torch.nn.Sigmoid), _classification(rng, steps, 16))
    if name == "zero-init":
        model = _mlp(depth=2)
        for parameter in model.parameters():
            torch.nn.init.zeros_(parameter)
        return _train(out, model, _classification(rng, steps, 16))
    if name == "negative-bias-relu":
        model = _mlp(depth=2)
        for layer in (model[0], model[2]):
            torch.nn.init.constant_(layer.bias, -20.0)
        return _train(out, model, _classification(rng, steps, 16))
    if name == "lr-huge":
        return _train(out, _mlp(depth=2), _classification(rng, steps, 16), lr=1e4)
    if name == "lr-zero":
        return _train(out, _mlp(depth=2), _classification(rng, steps, 16), lr=0.0)
    if name == "optimizer-on-a-copy":
        return _train(out, _mlp(depth=2), _classification(rng, steps, 16), optimizer_on_a_copy=True)
    raise KeyError(name)


HEALTHY = ("healthy-attention-key-bias", "healthy-frozen-first-layer", "healthy-batch1-zero-rows", "healthy-multilabel")


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_programs_stay_silent(tmp_path, name):
    path = _run(name, tmp_path)
    findings = {}
    for rule in (*TENSOR_STATE_RULES, "NotNormalizedData"):
        results = evaluate_rule(path, rule)
        findings.update((rule, r.message) for r in fired(results)[:1])
    assert not findings, f"{name}: {findings}"


def test_the_key_bias_false_alarm_is_what_sagemaker_semantics_raise(tmp_path):
    """The healthy attention run does trip SageMaker's single-step conditions on its key bias and
    its embeddings: the calibrated verdicts are silent because those gradients are zero by
    construction."""
    path = _run("healthy-attention-key-bias", tmp_path)
    finding = fired(evaluate_rule(path, "VanishingGradient:semantics=sagemaker"))[0]
    assert "key.bias" in finding.details["tensor"]
    finding = fired(evaluate_rule(path, "UnchangedTensor:semantics=sagemaker"))[0]
    assert "key.bias" in finding.details["tensor"]
    # the embedding's gradient: rows of the tokens and positions absent from the batch are zero
    finding = fired(evaluate_rule(path, "PoorWeightInitialization:semantics=sagemaker"))[0]
    assert "embeddings" in finding.details["gradient"]


FAULTS = {
    "deep-sigmoid": ("VanishingGradient",),
    "zero-init": ("PoorWeightInitialization", "AllZero"),
    "negative-bias-relu": ("DeadRelu",),
    "lr-huge": ("ExplodingTensor", "WeightUpdateRatio"),
    "lr-zero": ("UnchangedTensor", "WeightUpdateRatio"),
    "optimizer-on-a-copy": ("UnchangedTensor", "WeightUpdateRatio"),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_planted_faults_fire_their_rules(tmp_path, name):
    path = _run(name, tmp_path)
    for rule in FAULTS[name]:
        results = evaluate_rule(path, rule)
        findings = fired(results)
        assert findings, f"{name}: {rule} did not fire"
        # never from the first saved step alone (non-finite values aside)
        if rule != "ExplodingTensor" and not findings[0].details.get("ratio") == float("inf"):
            assert findings[0].step >= 1, (name, rule, findings[0].message)
    if name == "lr-huge":
        assert any(r.certain for r in fired(evaluate_rule(path, "ExplodingTensor")))
    # a vanished gradient (deep sigmoid) or activations blown up by the learning rate are not
    # poor initialisation: the init was fine at the first step
    if name in ("deep-sigmoid", "lr-huge"):
        assert fired(evaluate_rule(path, "PoorWeightInitialization")) == []
