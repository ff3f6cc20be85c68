"""The per-step sentinel (hooks/sentinel.py): a NaN at a step the schedule does not save is saved
at its own step, in runs of any length (LBFGS closures included: each evaluation is a step,
closure_steps.py), and healthy runs write nothing more than their schedule.

Each test fails without the sentinel: the NaN steps below are never scheduled saves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from tests.rules.synthetic import evaluate_rule, first_firing, open_trial
from trainguard.hooks.zero_code import ZeroCodeHook

REPO = Path(__file__).resolve().parents[2]

LBFGS_SCRIPT = """
import sys, torch
torch.manual_seed(0)
steps, nan_at = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
for step in range(steps):
    def closure():
        print("evaluation of step", step, flush=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == nan_at:
            loss = loss * float("nan")
        loss.backward()
        return loss
    optimizer.step(closure)
"""


def _lbfgs(hook_class, make_hook, steps: int, nan_at: int | None, **kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    hook = make_hook(hook_class, **kwargs)
    if hook_class is not ZeroCodeHook:
        hook.register_module(model)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    hook.calls = calls = []  # the optimizer step of each closure evaluation (each one a step)
    for step in range(steps):

        def closure(step=step):
            calls.append(step)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            if step == nan_at:
                loss = loss * float("nan")
            loss.backward()
            return loss

        optimizer.step(closure)
    hook.close()
    return hook


def _sgd(make_hook, steps: int, nan_at: int | None, *, zero_code: bool = False, touch_at: int | None = None,
         **kwargs):  # fmt: skip
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, **kwargs)
    if not zero_code:
        hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(16, 4, generator=generator)
        y = (x[:, 0] > 0).long()
        if step == nan_at:
            x = x * float("nan")
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        if step == touch_at:
            hook.get_collection("weights")  # ends the run of unsaved steps mid-step (QuietRun.shorten)
        optimizer.step()
    hook.close()
    return hook


@pytest.mark.parametrize("hook_class", [tg.Hook, ZeroCodeHook], ids=["api", "zero_code"])
def test_a_nan_in_a_five_step_lbfgs_run_is_found_at_its_step(make_hook, run_dir, hook_class):
    # the closure runs forward and backward several times per optimizer.step(), each evaluation a
    # step (closure_steps.py): the NaN is dated to the last evaluation of optimizer step 3, whose
    # gradient that step ends with
    hook = _lbfgs(hook_class, make_hook, 5, 3)
    nan_step = len(hook.calls) - 1 - hook.calls[::-1].index(3)
    trial = open_trial(run_dir)
    assert trial.steps() == [0, nan_step], (trial.steps(), hook.calls)  # without the sentinel: [0] only
    assert [step for step, _ in hook._sentinel.found] == [nan_step]
    results = evaluate_rule(trial, "ExplodingTensor")
    assert first_firing(results) == nan_step
    assert next(result for result in results if result.fired).certain


def test_a_healthy_short_lbfgs_run_saves_only_its_schedule(make_hook, run_dir):
    hook = _lbfgs(ZeroCodeHook, make_hook, 5, None)
    assert open_trial(run_dir).steps() == [0]
    assert not hook._sentinel.found
    assert first_firing(evaluate_rule(open_trial(run_dir), "ExplodingTensor")) is None


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_a_nan_between_saves_is_found_at_its_step(make_hook, run_dir, zero_code):
    _sgd(make_hook, 200, 57, zero_code=zero_code, save_config=tg.SaveConfig(save_interval=10))
    trial = open_trial(run_dir)
    assert 57 in trial.steps() and [s for s in trial.steps() if s % 10] == [57], trial.steps()
    assert first_firing(evaluate_rule(trial, "ExplodingTensor")) == 57


def test_the_step_is_right_after_a_run_of_unsaved_steps_was_cut_short(make_hook, run_dir):
    # get_collection() between step 53's backward and its optimizer.step() ends the run that
    # began at step 51: step 53's gradient is still dated 53, and the NaN of step 57 (in the run
    # that step 54 begins) 57
    for nan_at in (53, 57):
        out = f"{run_dir}-{nan_at}"
        _sgd(make_hook, 100, nan_at, touch_at=53, save_config=tg.SaveConfig(save_interval=10), out_dir=out)
        assert first_firing(evaluate_rule(open_trial(out), "ExplodingTensor")) == nan_at


def test_a_healthy_run_writes_only_its_schedule(make_hook, run_dir):
    hook = _sgd(make_hook, 100, None, save_config=tg.SaveConfig(save_interval=10))
    assert open_trial(run_dir).steps() == list(range(0, 100, 10))
    assert not hook._sentinel.found and not hook._sentinel.entries


def test_lbfgs_nan_run_is_stopped_at_its_step_by_the_cli(tmp_path):
    script = tmp_path / "lbfgs_nan.py"
    script.write_text(LBFGS_SCRIPT)
    out = tmp_path / "run"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "run", "--out", str(out), "--rules", "--stop-on-issue", "--",
         sys.executable, str(script), "5", "3"],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    record = json.loads((out / "trainguard-stop.json").read_text())
    # each closure evaluation is a step: the NaN's is the last evaluation of optimizer step 3
    calls = [int(line.split()[-1]) for line in result.stdout.splitlines() if line.startswith("evaluation of step")]
    assert record["step"] == len(calls) - 1 - calls[::-1].index(3) and record["certain"], (record, calls)
    assert record["configuration_name"] == "ExplodingTensor"
