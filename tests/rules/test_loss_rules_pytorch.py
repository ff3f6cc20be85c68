"""The loss and classification rules on real (tiny) PyTorch training captured by the PyTorch hook:
silent on a healthy run with validation, firing on the faults they are for. The tensors are the
hook's own (``CrossEntropyLoss_output_0`` in ``losses``, the loss inputs in ``predictions`` /
``labels``), selected by the rules' defaults."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
from tests.rules.synthetic import evaluate_rule, first_firing  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

RULES = ["LossNotDecreasing", "Overfit", "Underfitting", "Overtraining", "ClassImbalance", "Confusion"]


def _train(out, *, lr=3e-3, optimizer="adam", epochs=4, class_weights=None, seed=0):
    """A 5-class MLP on separable blobs: 160 training steps, 4 validation batches per epoch."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(5, 20))
    y = rng.choice(5, size=1680, p=class_weights)
    X = torch.tensor(centers[y] + rng.normal(size=(1680, 20)), dtype=torch.float32)
    y = torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    criterion = torch.nn.CrossEntropyLoss()
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=lr)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=1),
                   include_collections=["losses", "labels", "predictions"])
    hook.register_module(model)
    hook.register_loss(criterion)
    for _ in range(epochs):
        hook.set_mode(tg.modes.TRAIN)
        model.train()
        for start in range(0, 1280, 32):
            opt.zero_grad()
            criterion(model(X[start : start + 32]), y[start : start + 32]).backward()
            opt.step()
        hook.set_mode(tg.modes.EVAL)
        model.eval()
        with torch.no_grad():
            for start in range(1280, 1680, 100):
                criterion(model(X[start : start + 100]), y[start : start + 100])
    hook.close()
    return create_trial(out)


def _first_firings(trial):
    return {spec: first_firing(evaluate_rule(trial, spec)) for spec in RULES}


def test_healthy_run_is_silent_and_the_rules_find_the_hooks_tensors(tmp_path):
    trial = _train(str(tmp_path / "run"))
    assert trial.tensor_names(collection="losses") == ["CrossEntropyLoss_output_0"]
    assert trial.tensor_names(collection="labels") == ["CrossEntropyLoss_input_1"]
    assert _first_firings(trial) == dict.fromkeys(RULES)
    # the rules did evaluate (not silent for lack of data)
    assert any(not r.fired for r in evaluate_rule(trial, "ClassImbalance") if r.details.get("misprediction_rates"))
    assert evaluate_rule(trial, "Overfit")


def test_faults_fire_their_rules(tmp_path):
    # a learning rate far too small: the model stays at its random start
    frozen = _train(str(tmp_path / "tiny-lr"), optimizer="sgd", lr=1e-6, epochs=3)
    firings = _first_firings(frozen)
    assert firings["Underfitting"] is not None and firings["ClassImbalance"] is not None
    assert firings["Overfit"] is None
    imbalanced = _train(str(tmp_path / "imbalanced"), class_weights=[0.92, 0.05, 0.01, 0.01, 0.01], epochs=1)
    results = evaluate_rule(imbalanced, "ClassImbalance")
    assert first_firing(results) is not None and "WeightedRandomSampler" in next(r for r in results if r.fired).fix_hint
