"""Steps where the registered model's own forward is not what a step is made of (issue 43):

- a forward-forward net trains each layer through ``layer.forward(x)`` called directly, so no
  root forward is ever seen: each optimizer step is a step (torch_optimizer.py,
  ``_step_without_forward``); the run saved nothing at all before;
- LBFGS evaluates its closure several times per ``optimizer.step``, updating the parameters in
  between: each evaluation is a step (closure_steps.py), so that a 10-step LBFGS run at a save
  interval of 5 is not two saved steps; gradient accumulation stays one step per window.

Each test fails without its change.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from tests.rules.synthetic import evaluate_rule, first_firing, open_trial


class _Layer(nn.Linear):
    def __init__(self, n_in: int, n_out: int, lr: float) -> None:
        super().__init__(n_in, n_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=lr)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return torch.relu(torch.mm(x / (x.norm(2, 1, keepdim=True) + 1e-4), self.weight.T) + self.bias)

    def train_layer(self, x, epochs: int):  # type: ignore[no-untyped-def]
        for _ in range(epochs):
            loss = (1.0 - self.forward(x).pow(2).mean(1)).abs().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return self.forward(x).detach()


class _Net(nn.Module):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(8, 16, lr), _Layer(16, 16, lr)])


def _forward_forward(make_hook, lr: float, epochs: int = 20, **kwargs):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = _Net(lr)
    hook = make_hook(save_config=tg.SaveConfig(save_interval=2), **kwargs)
    hook.register_module(net)  # Net.forward is never called: the layers' forward is, directly
    h = torch.randn(64, 8)
    for layer in net.layers:
        h = layer.train_layer(h, epochs)
    hook.close()
    return hook


def test_a_forward_forward_net_is_captured_at_every_optimizer_step(make_hook, run_dir):
    _forward_forward(make_hook, lr=0.03)
    trial = open_trial(run_dir)  # without the change: no collections file, no step at all
    assert trial.steps() == list(range(0, 40, 2)), trial.steps()
    assert "_Net_layers.0.weight" in trial.tensor_names(collection="weights")
    # the first layer is trained in steps 0-19 (its gradients saved there), the second after
    assert trial.tensor("gradient/_Net_layers.0.weight").steps() == list(range(0, 20, 2))
    assert trial.tensor("gradient/_Net_layers.1.weight").steps() == list(range(20, 40, 2))


def test_a_frozen_layer_wise_run_is_found_and_a_healthy_one_is_not(make_hook, run_dir, tmp_path):
    _forward_forward(make_hook, lr=0.03)
    # the layer not being trained in a phase has no gradient there: not "too small", not "unchanged"
    for rule in ("WeightUpdateRatio", "UnchangedTensor"):
        healthy = evaluate_rule(open_trial(run_dir), rule)
        assert first_firing(healthy) is None, (rule, [r.message for r in healthy if r.fired])
    frozen_dir = tmp_path / "frozen"
    _forward_forward(make_hook, lr=0.0, out_dir=str(frozen_dir))
    found = evaluate_rule(open_trial(frozen_dir), "WeightUpdateRatio")
    assert first_firing(found) is not None
    assert next(r for r in found if r.fired).details["direction"] == "small"
    assert first_firing(evaluate_rule(open_trial(frozen_dir), "UnchangedTensor")) is not None


def _lbfgs(make_hook, lr: float, steps: int, interval: int = 5, out_dir: str | None = None):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    kwargs = {"out_dir": out_dir} if out_dir else {}
    hook = make_hook(save_config=tg.SaveConfig(save_interval=interval), **kwargs)
    hook.register_module(model)
    criterion = nn.MSELoss()
    hook.register_loss(criterion)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=lr, max_iter=4)
    evaluations: list[tuple[np.ndarray, np.ndarray]] = []  # (weight used, its gradient) per closure call
    for _ in range(steps):

        def closure():  # type: ignore[no-untyped-def]
            optimizer.zero_grad()
            weight = model[0].weight.detach().clone().numpy()
            loss = criterion(model(x), y)
            loss.backward()
            evaluations.append((weight, model[0].weight.grad.detach().clone().numpy()))
            return loss

        optimizer.step(closure)
    hook.close()
    return evaluations


def test_each_lbfgs_closure_evaluation_is_a_step_with_its_weights_and_gradient(make_hook, run_dir):
    evaluations = _lbfgs(make_hook, lr=0.5, steps=5)
    assert len(evaluations) > 5  # several evaluations per optimizer.step()
    trial = open_trial(run_dir)
    saved = list(range(0, len(evaluations), 5))
    assert trial.steps() == saved, (trial.steps(), len(evaluations))  # without the change: [0]
    for step in saved:
        weight, gradient = evaluations[step]
        np.testing.assert_array_equal(trial.tensor("Sequential_0.weight").value(step), weight)
        if step:  # (the first evaluation's gradient is dropped before closure steps are known)
            np.testing.assert_array_equal(trial.tensor("gradient/Sequential_0.weight").value(step), gradient)


def test_a_ten_step_lbfgs_run_at_lr_0_is_judged(make_hook, run_dir):
    evaluations = _lbfgs(make_hook, lr=0.0, steps=10)
    assert len(evaluations) == 20  # LBFGS at lr 0: the first evaluation and one after a zero update
    results = evaluate_rule(open_trial(run_dir), "WeightUpdateRatio")
    fired = [r for r in results if r.fired]  # without the change: 2 saved steps, nothing judged
    assert fired and fired[0].details["direction"] == "small", [r.message for r in results]


def test_a_healthy_lbfgs_run_is_not_too_small_or_large(make_hook, run_dir):
    _lbfgs(make_hook, lr=0.5, steps=10)
    assert first_firing(evaluate_rule(open_trial(run_dir), "WeightUpdateRatio")) is None


def test_gradient_accumulation_stays_one_step_per_window(make_hook, run_dir):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    hook = make_hook(save_config=tg.SaveConfig(save_interval=1))
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        optimizer.zero_grad()
        for _ in range(3):
            model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    hook.close()
    assert open_trial(run_dir).steps() == [0, 1, 2, 3]
    assert not hook._closures.active
