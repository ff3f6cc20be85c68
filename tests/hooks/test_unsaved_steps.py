"""Steps that save nothing cost no per-module Python: module forward hooks exist on saved steps only
(eager), and for good under torch.compile, where Dynamo would not see hooks added later."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial


class Probe(nn.Module):
    """Records, at each forward, how many forward hooks it carries (Python calls it will make)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.hook_counts: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.hook_counts.append(len(self._forward_hooks) + len(self.fc._forward_hooks))
        return self.fc(x)


def _train(model: nn.Module, steps: int) -> list[float]:
    torch.manual_seed(5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_module_hooks_exist_only_on_saved_steps(make_hook, run_dir):
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(probe, nn.ReLU(), nn.Linear(4, 2))
    hook = make_hook(save_config=tg.SaveConfig(save_interval=3), include_collections=["outputs", "losses"])
    hook.register_module(model)
    _train(model, 7)
    hook.close()
    assert probe.hook_counts == [2, 0, 0, 2, 0, 0, 2]
    assert all(not module._forward_hooks for module in model.modules())  # none left after close
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 3, 6]
    for step in trial.steps():
        assert trial.tensor("0.fc_output_0").value(step).shape == (3, 4)


def test_compiled_model_keeps_its_hooks_and_captures_every_saved_step(make_hook, run_dir):
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    hooked = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    hooked.load_state_dict(plain.state_dict())
    reference = _train(plain, 6)
    hook = make_hook(save_config=tg.SaveConfig(save_interval=2), include_collections=["outputs", "losses"])
    hook.register_module(hooked)
    assert _train(torch.compile(hooked, backend="eager"), 6) == reference
    hook.close()
    assert hook.enabled
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 2, 4]
    for step in trial.steps():
        relu = trial.tensor("1_output_0").value(step)
        assert relu.shape == (3, 8) and (relu >= 0).all()
        np.testing.assert_array_equal(relu, np.maximum(trial.tensor("0_output_0").value(step), 0))
