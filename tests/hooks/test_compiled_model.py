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


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_compiled_model_under_the_hook_gets_no_global_hook_warning(make_hook, run_dir, zero_code):
    """torch warns when a compiled model runs while any global module hook exists; ours expect the
    wrapper's extra call, so a run under trainguard (with the hook's global hooks before its root
    is found and, zero-code, on saved steps) shows no such warning. The control: a global hook of
    the script's own, without trainguard, does get it from this torch."""
    import warnings

    from torch.nn.modules.module import register_module_forward_pre_hook

    from trainguard.hooks.zero_code import ZeroCodeHook

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = register_module_forward_pre_hook(lambda module, args: None)
        try:
            torch.compile(nn.Linear(8, 1), backend="eager")(torch.randn(4, 8))
        finally:
            handle.remove()
    if not any("global hooks" in str(warning.message) for warning in caught):
        pytest.skip("this torch does not warn about global hooks under torch.compile")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, save_config=tg.SaveConfig(save_interval=2),
                         save_all=True)  # fmt: skip
        model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))
        if not zero_code:
            hook.register_module(model)
        _train(model, 5, compile_it=True)
        hook.close()
    assert hook.enabled
    assert not [str(warning.message) for warning in caught if "global hooks" in str(warning.message)]
    assert create_trial(run_dir).steps() == [0, 2, 4]


def test_the_warning_filter_goes_ahead_of_error_filters_and_is_added_once():
    """Under ``-W error`` (simplefilter("error")) the torch warning would raise in the training loop:
    the hook's filter goes ahead of it. It is added only where it is not already first: each change
    of the filter list makes Python forget which warnings it showed once."""
    import warnings

    from trainguard.hooks.torch_global_hooks import register_global_forward_pre_hook

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handles = [register_global_forward_pre_hook(lambda module, args: None)]
        filters = len(warnings.filters)
        handles.append(register_global_forward_pre_hook(lambda module, args: None))
        assert len(warnings.filters) == filters  # already ahead: the list is left alone
        try:
            output = torch.compile(nn.Linear(8, 1), backend="eager")(torch.randn(4, 8))
        finally:
            for handle in handles:
                handle.remove()
        assert output.shape == (4, 1)
        with pytest.raises(UserWarning):
            warnings.warn("any other warning still raises", UserWarning, stacklevel=1)
