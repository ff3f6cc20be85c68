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
    # a learning rate far too small: the model stays at its random start. Underfitting says so;
    # ClassImbalance does not (most classes mispredicted is not a class-specific failure)
    frozen = _train(str(tmp_path / "tiny-lr"), optimizer="sgd", lr=1e-6, epochs=3)
    firings = _first_firings(frozen)
    assert firings["Underfitting"] is not None and firings["ClassImbalance"] is None
    assert firings["Overfit"] is None
    imbalanced = _train(str(tmp_path / "imbalanced"), class_weights=[0.92, 0.05, 0.01, 0.01, 0.01], epochs=1)
    results = evaluate_rule(imbalanced, "ClassImbalance")
    assert first_firing(results) is not None and "WeightedRandomSampler" in next(r for r in results if r.fired).fix_hint


# -- calibrated semantics on real training loops (issue 11) -----------------------------------------

LOSS_RULES = ("LossNotDecreasing", "Underfitting", "Overtraining", "Overfit")


def _loop(out, *, lr=0.05, steps=300, batch=8, autocast=False, accumulate=1, seed=0, data="blobs"):
    """A plain training loop without validation (the loop issue 11 saw stopped at step 60)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if data == "xor":
        X = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
        y = torch.tensor([0, 1, 1, 0])
        model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    else:
        centers = rng.normal(size=(5, 20))
        labels = rng.choice(5, size=4000)
        X = torch.tensor(centers[labels] + 1.5 * rng.normal(size=(4000, 20)), dtype=torch.float32)
        y = torch.tensor(labels)
        model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    criterion = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.register_module(model)
    hook.register_loss(criterion)
    hook.set_mode(tg.modes.TRAIN)
    for step in range(steps):
        if data == "xor":
            xb, yb = X, y
        else:
            start = (step * batch) % (len(X) - batch)
            xb, yb = X[start : start + batch], y[start : start + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = criterion(model(xb), yb) / accumulate
        loss.backward()
        if (step + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
    hook.close()
    return create_trial(out)


def _verdicts(trial):
    results = {rule: evaluate_rule(trial, rule) for rule in LOSS_RULES}
    return {rule: [r for r in found if r.fired] for rule, found in results.items()}, results


@pytest.mark.parametrize("variant", ["plain", "bf16-autocast", "grad-accumulation"])
def test_healthy_noisy_loop_without_validation_is_silent(tmp_path, variant):
    trial = _loop(str(tmp_path / "run"), autocast=variant == "bf16-autocast",
                  accumulate=4 if variant == "grad-accumulation" else 1)
    fired, results = _verdicts(trial)
    assert fired == dict.fromkeys(LOSS_RULES, []), {rule: [r.message for r in found] for rule, found in fired.items()}
    # LossNotDecreasing and Underfitting did judge; the validation rules say they could not
    assert any(r.evaluated for r in results["LossNotDecreasing"])
    # 300 micro-batches accumulated by 4 are 75 optimizer steps: before Underfitting's warm-up
    assert results["Underfitting"][-1].evaluated or "warmup" in results["Underfitting"][-1].not_evaluated
    assert results["Overtraining"][-1].not_evaluated and results["Overfit"][-1].not_evaluated


def test_converged_xor_net_is_neither_underfitting_nor_overtraining(tmp_path):
    trial = _loop(str(tmp_path / "xor"), data="xor", lr=0.5, steps=1500)
    final = trial.tensor("CrossEntropyLoss_output_0").value(trial.steps()[-1])
    assert float(np.mean(final)) < 0.01  # it converged
    fired, _ = _verdicts(trial)
    assert fired == dict.fromkeys(LOSS_RULES, [])


def test_frozen_and_exploding_loops_fire(tmp_path):
    frozen = _loop(str(tmp_path / "lr0"), lr=0.0, batch=64, steps=200)
    fired, _ = _verdicts(frozen)
    assert fired["LossNotDecreasing"] and not any(r.certain for r in fired["LossNotDecreasing"])
    assert fired["LossNotDecreasing"][0].details["losses"]["CrossEntropyLoss_output_0"]["kind"] == "plateau"
    assert fired["Underfitting"] and "optimizer" in fired["Underfitting"][0].fix_hint
    exploding = _loop(str(tmp_path / "lr100"), lr=100.0, steps=120)
    fired, _ = _verdicts(exploding)
    assert fired["LossNotDecreasing"] and any(r.certain for r in fired["LossNotDecreasing"])
    first_certain = next(r for r in fired["LossNotDecreasing"] if r.certain)
    assert first_certain.step < 60 and "learning rate" in first_certain.fix_hint


def test_real_overfitting_fires_overfit_and_overtraining(tmp_path):
    """A wide MLP memorising 48 noisy examples: training loss falls, validation loss turns up."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    w = rng.normal(size=20)
    X = rng.normal(size=(448, 20))
    y = ((X @ w + 2.0 * rng.normal(size=448)) > 0).astype(np.int64)
    X, y = torch.tensor(X, dtype=torch.float32), torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    criterion = torch.nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.register_module(model)
    hook.register_loss(criterion)
    for _ in range(60):
        hook.set_mode(tg.modes.TRAIN)
        for start in range(0, 48, 16):
            opt.zero_grad()
            criterion(model(X[start : start + 16]), y[start : start + 16]).backward()
            opt.step()
        hook.set_mode(tg.modes.EVAL)
        with torch.no_grad():
            for start in range(48, 448, 200):
                criterion(model(X[start : start + 200]), y[start : start + 200])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    fired, _ = _verdicts(trial)
    assert fired["Overfit"] and fired["Overfit"][0].certain
    assert fired["Overtraining"]
    assert not fired["Underfitting"]
