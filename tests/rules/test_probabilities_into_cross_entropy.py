"""ProbabilitiesIntoCrossEntropy: a Softmax before CrossEntropyLoss is found from the loss's own
input on a real (tiny) run; raw logits, log-probabilities and a binary loss stay silent."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.rules.builtin.probabilities_into_cross_entropy import probability_rows

torch = pytest.importorskip("torch")

import trainguard.pytorch as tg  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

RULE = "ProbabilitiesIntoCrossEntropy"


def test_probability_rows_matches_a_numpy_oracle():
    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = rng.normal(0, rng.uniform(0.1, 5), size=(16, int(rng.integers(2, 12)))).astype(np.float32)
        softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        oracle = lambda a: bool(a.min() >= 0 and a.max() <= 1 and np.all(np.abs(a.sum(axis=1) - 1) <= 1e-3))  # noqa: E731
        for array in (logits, softmax, np.log(softmax), softmax * 0.9):
            assert probability_rows(array, 1e-3) == oracle(array)
    assert not probability_rows(np.full((4, 1), 1.0, dtype=np.float32), 1e-3)  # one class: nothing to say
    assert not probability_rows(np.array([0, 1, 1]), 1e-3)  # class ids, not scores


def _train(out, head):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=20 * 16)
    X = torch.tensor(rng.normal(size=(4, 8))[y] * 2 + rng.normal(size=(y.size, 8)), dtype=torch.float32)
    y = torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), *head)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=5), include_collections=["losses", "predictions"])
    hook.register_module(model)
    hook.register_loss(criterion)
    for step in range(20):
        optimizer.zero_grad()
        criterion(model(X[step * 16:(step + 1) * 16]), y[step * 16:(step + 1) * 16]).backward()
        optimizer.step()
    hook.close()
    return create_trial(out)


def test_a_softmax_before_cross_entropy_fires_at_the_first_saved_step_and_logits_stay_silent(tmp_path):
    results = evaluate_rule(_train(str(tmp_path / "softmax"), [torch.nn.Softmax(dim=1)]), RULE)
    fired = [result for result in results if result.fired]
    assert fired and fired[0].step == 0 and "CrossEntropyLoss_input_0" in fired[0].message
    assert "remove the" in fired[0].fix_hint
    for name, head in {"logits": [], "log-softmax": [torch.nn.LogSoftmax(dim=1)]}.items():
        results = evaluate_rule(_train(str(tmp_path / name), head), RULE)
        assert first_firing(results) is None and any(not r.fired and r.step >= 0 for r in results), name


def test_a_run_without_cross_entropy_is_not_evaluated(tmp_path):
    steps = {s: {"BCELoss_input_0": np.full((8, 1), 0.5, dtype=np.float32)} for s in range(3)}
    results = evaluate_rule(write_run(tmp_path / "bce", steps, collections={"predictions": ["BCELoss_input_0"]}), RULE)
    assert first_firing(results) is None and results[-1].not_evaluated and results[-1].not_applicable


def test_binary_cross_entropy_on_two_softmax_columns_is_meant_for_probabilities(tmp_path):
    # F.binary_cross_entropy takes probabilities by design: a softmax over two columns is no bug.
    softmax = np.array([[0.3, 0.7], [0.9, 0.1]] * 4, dtype=np.float32)
    name = "binary_cross_entropy_input_0"
    steps = {s: {name: softmax} for s in range(3)}
    results = evaluate_rule(write_run(tmp_path / "bce2", steps, collections={"predictions": [name]}), RULE)
    assert first_firing(results) is None
