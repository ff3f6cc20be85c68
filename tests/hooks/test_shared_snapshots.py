"""One host copy per tensor and step: a module's output that is the next module's input is copied
once, and a tensor changed in place between the two captures is copied again."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial


def test_output_reused_as_input_is_saved_under_both_names_and_inplace_changes_are_seen(make_hook, run_dir):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 2))
    seen: dict[str, list[np.ndarray]] = {"pre": [], "post": []}
    model[0].register_forward_hook(lambda module, args, output: seen["pre"].append(output.detach().clone().numpy()))
    model[1].register_forward_hook(lambda module, args, output: seen["post"].append(output.detach().clone().numpy()))
    hook = make_hook(save_config=tg.SaveConfig(save_interval=1), save_all=True)
    hook.register_module(model)
    copies = []
    original = hook._saver._snapshot_once

    def counting(tensor):
        copy = original(tensor)
        copies.append(copy)
        return copy

    hook._saver._snapshot_once = counting
    x = torch.randn(5, 4)
    model(x).sum().backward()
    hook.close()

    trial = create_trial(run_dir)
    pre, post = seen["pre"][0], seen["post"][0]
    assert (pre < 0).any()  # the in-place ReLU really changed the Linear's output object
    # the Linear's output was copied before the in-place ReLU ran; the ReLU's input and output and the
    # next Linear's input are the same object after it: all three show the rectified values
    np.testing.assert_array_equal(trial.tensor("0_output_0").value(0), pre)
    for name in ("1_input_0", "1_output_0", "2_input_0"):
        np.testing.assert_array_equal(trial.tensor(name).value(0), post)
    np.testing.assert_array_equal(trial.tensor("0_input_0").value(0), x.numpy())
    # one copy for the ReLU's (changed) tensor shared by three names, not three copies
    distinct = {id(copy[0]) for copy in copies}
    assert len(copies) > len(distinct)
