"""Zero code change: a model trained after the first one (a second stage, a head fine-tuned on
its own) is found by its new optimizer and captured like the first, its steps counted on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import trainguard.pytorch as tg
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.trials import create_trial

STAGE_STEPS = 60


def _two_stages(hook_out: str | None, up_front: bool = False) -> tuple[list[float], int | None]:
    """Train model A, then a new model B with its own optimizer; the losses, and the hook's step.
    ``up_front``: both models and optimizers made before A trains (B's optimizer then exists
    through A's unsaved steps, when an only optimizer ends steps without the post-hook)."""
    torch.manual_seed(0)
    hook = None
    if hook_out is not None:
        hook = ZeroCodeHook(out_dir=hook_out, include_collections=["losses", "weights"],
                            save_config=tg.SaveConfig(save_interval=20))  # fmt: skip
    losses = []
    stages = []
    for width in (8, 16):
        if not up_front and stages:
            stages.clear()  # A's model and optimizer go before B's are made
        model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
        stages.append((model, torch.optim.SGD(model.parameters(), lr=0.1)))
        if up_front:
            continue
        losses += _train(*stages[-1])
    for model, optimizer in stages if up_front else ():
        losses += _train(model, optimizer)
    if hook is None:
        return losses, None
    hook.close()
    assert hook.enabled
    return losses, hook.step


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    losses = []
    for _ in range(STAGE_STEPS):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("up_front", [False, True], ids=["made_in_turn", "made_up_front"])
def test_a_model_trained_after_the_first_is_captured(tmp_path, up_front):
    plain, _ = _two_stages(None, up_front)
    losses, last_step = _two_stages(str(tmp_path / "run"), up_front)
    assert losses == plain  # training unchanged
    # B's first forward comes before its optimizer first steps: that one step is not seen
    assert last_step == 2 * STAGE_STEPS - 2
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 20, 40, 60, 80, 100]
    second = [name for name in trial.tensor_names(collection="weights") if name.startswith("Sequential_1_")]
    assert sorted(second) == ["Sequential_1_0.weight", "Sequential_1_2.weight"]
    for name in second:
        assert trial.tensor(name).steps() == [60, 80, 100]
    assert trial.tensor("Sequential_1_0.weight").value(60).shape == (16, 4)
    assert trial.tensor("Sequential_1_2.weight").value(60).shape == (2, 16)
    assert trial.tensor_names(collection="losses") == ["loss_cross_entropy_output_0"]
    loss_name = "loss_cross_entropy_output_0"
    assert trial.tensor(loss_name).steps() == trial.steps()
    assert all(np.isfinite(trial.tensor(loss_name).value(step)).all() for step in trial.steps())
    assert trial.independent_optimizers == 1  # one stage after the other: not competing


def test_a_new_optimizer_at_a_freed_ones_address_is_a_new_optimizer(tmp_path):
    """CPython may give a new optimizer the memory, and so the id, of one just freed (seen once in
    the test above: B's steps were then never counted). The hook must not take the new one's first
    step for the old one's next: here its id comes with the old one's entries already noted."""
    hook = ZeroCodeHook(out_dir=str(tmp_path / "run"), include_collections=["losses", "weights"],
                        save_config=tg.SaveConfig(save_interval=20))  # fmt: skip
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(first.parameters(), lr=0.1)
    _train(first, optimizer)
    noted = hook._optimizer_parameters[id(optimizer)]

    class AtTheFreedAddress(torch.optim.SGD):
        def __init__(self, *args, **kwargs) -> None:
            hook._optimizer_parameters.clear()  # the first optimizer freed; its entry left at this id
            hook._optimizer_parameters[id(self)] = noted
            super().__init__(*args, **kwargs)

    second = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    _train(second, AtTheFreedAddress(second.parameters(), lr=0.1))
    hook.close()
    assert hook.step == 2 * STAGE_STEPS - 2  # as in the test above: B's first forward is not seen
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("Sequential_1_0.weight").steps() == [60, 80, 100]
