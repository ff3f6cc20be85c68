"""A torch.compile'd model is captured like an eager one: the hook's Python runs outside the graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial


def _train(model, steps, *, compile_it):
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # backend "eager": Dynamo traces (what matters for the hook), no C++ toolchain needed
    compiled = torch.compile(model, backend="eager") if compile_it else model
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = compiled(torch.randn(4, 8)).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("save_all", [False, True])
def test_compiled_model_is_captured_and_training_is_unchanged(make_hook, run_dir, save_all):
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    hooked = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    hooked.load_state_dict(plain.state_dict())
    # Not compiled: Dynamo would reuse that graph for the same-shaped hooked model, and it does
    # not guard on module hooks (a limitation of torch.compile for any hook registered later).
    reference = _train(plain, 5, compile_it=False)
    hook = make_hook(save_config=tg.SaveConfig(save_interval=2), save_all=save_all)
    hook.register_module(hooked)
    assert _train(hooked, 5, compile_it=True) == reference  # bit-identical losses
    hook.close()
    assert hook.enabled, "capture must not have been disabled by Dynamo tracing the hook"
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 2, 4]
    assert "gradient/Sequential_0.weight" in trial.tensor_names()
    if save_all:
        # activations of the compiled children are captured too, with their eager values
        relu_out = trial.tensor("1_output_0").value(0)
        assert relu_out.shape == (4, 16) and (relu_out >= 0).all()
        np.testing.assert_array_equal(trial.tensor("2_input_0").value(0), relu_out)
