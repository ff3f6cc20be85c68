"""A registered root's calls reach the hook through a call shim (torch_root_call.py), not a
forward pre-hook: the model keeps PyTorch's fast call path, copies and pickles without the hook,
and counts the same steps; anything compiled gets the pre-hooks Dynamo needs."""

from __future__ import annotations

import copy
import io
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.hooks import torch_root_call
from trainguard.hooks.torch_root_call import RootCall
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.modes import ModeKeys
from trainguard.trials import create_trial


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _make(make_hook, out_dir: str, zero_code: bool, model: nn.Module, criterion: nn.Module, **kwargs):
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=out_dir, **kwargs)
    if not zero_code:
        hook.register_module(model)
        hook.register_loss(criterion)
    return hook


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_a_root_keeps_the_fast_call_path_and_copies_and_pickles_without_the_hook(make_hook, tmp_path, zero_code):
    torch.manual_seed(0)
    model, criterion = Net(), nn.CrossEntropyLoss()
    hook = _make(make_hook, str(tmp_path / "run"), zero_code, model, criterion,
                 save_config=tg.SaveConfig(save_interval=4),
                 include_collections=["losses", "weights", "outputs"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = torch.randn(3, 4)
    for step in range(7):
        loss = criterion(model(torch.randn(5, 4)), torch.randint(0, 2, (5,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert not model._forward_pre_hooks, step  # and, on unsaved steps, no hook at all:
        assert step % 4 == 0 or not any(module._forward_hooks for module in model.modules()), step
        assert isinstance(model.__dict__.get("_compiled_call_impl"), type(lambda: None)), step
        # An EMA copy, or a checkpoint of the whole model, on any step (a saved step's module
        # hooks are still on the model until the next step begins): neither takes the hook along
        # nor fails on its state. (Not model(probe): a forward of the model would begin a step.)
        twin = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        for other in (twin, loaded):
            assert "_compiled_call_impl" not in other.__dict__ and not other._forward_pre_hooks
            left = [hook for module in other.modules() for hook in module._forward_hooks.values()]
            assert all(getattr(hook, "func", None) is sys.audit for hook in left), left
            assert len(left) == sum(len(module._forward_hooks) for module in model.modules())
        assert torch.equal(loaded(probe), twin(probe))
    hook.close()
    assert hook.enabled
    assert "_compiled_call_impl" not in model.__dict__  # close gives the model its calls back
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 4]


def _steps_and_values(run: str) -> dict:
    trial = create_trial(run)
    found = {"steps": trial.steps()}
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
        found[mode.name] = trial.steps(mode=mode)
    for name in trial.tensor_names():
        for step in trial.tensor(name).steps():
            found[(name, step)] = trial.tensor(name).value(step)
    return found


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_shims_and_pre_hooks_see_the_same_steps_modes_and_tensors(make_hook, tmp_path, monkeypatch, zero_code):
    """Gradient accumulation, validation in eval mode and under no_grad alone, scalars saved
    between optimizer.step() and the next forward: the same run, the same files either way."""

    def run(shims: bool) -> dict:
        monkeypatch.setattr(torch_root_call, "shims_safe", lambda: shims)
        torch.manual_seed(0)
        model, criterion = Net(), nn.CrossEntropyLoss()
        out_dir = str(tmp_path / f"shims_{shims}")
        hook = _make(make_hook, out_dir, zero_code, model, criterion, save_config=tg.SaveConfig(save_interval=3),
                     include_collections=["losses", "weights", "gradients", "outputs"])  # fmt: skip
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(4)]
        for _ in range(2):
            model.train()
            for step in range(8):
                optimizer.zero_grad()
                for x, y in data[:2]:  # two micro-batches per optimizer step
                    criterion(model(x), y).backward()
                optimizer.step()
                if step % 3 == 1:
                    hook.save_scalar("after_step", float(step))
            with torch.no_grad():
                model(data[2][0])  # validation without eval(): EVAL by the grad mode
                model.eval()
                for x, y in data[2:]:
                    criterion(model(x), y)
        hook.close()
        assert hook.enabled
        # closed: none
        assert isinstance(hook._driver.root_hooks.get(id(model)), RootCall) or not hook._driver.root_hooks
        return _steps_and_values(out_dir)

    with_shims, with_pre_hooks = run(True), run(False)
    assert with_shims.keys() == with_pre_hooks.keys()
    assert with_shims["EVAL"] and len(with_shims["TRAIN"]) > 3
    for key, value in with_shims.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, with_pre_hooks[key], err_msg=str(key))
        else:
            assert value == with_pre_hooks[key], key


def test_torch_compile_gives_every_shimmed_root_its_pre_hook_first(make_hook, run_dir):
    """torch.compile is watched: before anything is traced, roots change to pre-hooks, which
    Dynamo sees (it bypasses the shim of a torch.nn container and calls no hook added later)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    hook = make_hook(save_config=tg.SaveConfig(save_interval=4), include_collections=["losses"])
    hook.register_module(model)
    hook.register_loss(criterion := nn.CrossEntropyLoss())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(runnable: nn.Module, steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            criterion(runnable(torch.randn(5, 4)), torch.randint(0, 2, (5,))).backward()
            optimizer.step()

    train(model, 2)
    assert isinstance(hook._driver.root_hooks[id(model)], RootCall) and not model._forward_pre_hooks
    step_function = torch.compile(lambda x: model(x), backend="eager")  # a function, not the model
    assert "_compiled_call_impl" not in model.__dict__ and len(model._forward_pre_hooks) == 1
    train(step_function, 10)
    hook.close()
    assert hook.enabled
    trial = create_trial(str(run_dir))
    assert trial.steps() == [0, 4, 8]


def test_module_compile_after_registration_keeps_counting_steps(make_hook, run_dir):
    torch._dynamo.reset()

    def run(hooked: bool) -> list[float]:
        torch.manual_seed(0)
        model, criterion = Net(), nn.CrossEntropyLoss()
        hook = None
        if hooked:
            hook = make_hook(save_config=tg.SaveConfig(save_interval=4), include_collections=["losses"])
            hook.register_module(model)
            hook.register_loss(criterion)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for step in range(12):
            if step == 3:
                model.compile(backend="eager")  # fills the slot the shim was in
            optimizer.zero_grad()
            loss = criterion(model(torch.randn(5, 4)), torch.randint(0, 2, (5,)))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if hook is not None:
            hook.close()
            assert hook.enabled
        return losses

    assert run(True) == run(False)
    trial = create_trial(str(run_dir))
    assert trial.steps() == [0, 4, 8]


def test_compiled_code_the_watch_did_not_see_is_reported(make_hook, run_dir, caplog):
    """Code compiled past the watch (torch.compile's original, as a script that took it before
    trainguard watched would hold) runs the root without its shim: two optimizer steps with no
    forward seen say so, in the log, and the root gets its pre-hook for code traced from then on."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    hook = make_hook(save_config=tg.SaveConfig(save_interval=4), include_collections=["losses"])
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(runnable: nn.Module, steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            runnable(torch.randn(5, 4)).square().mean().backward()
            optimizer.step()

    train(model, 2)  # eagerly first: the hook stops looking for a compile wrapper
    unwatched_compile = getattr(torch.compile, "__wrapped__", torch.compile)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        train(unwatched_compile(model, backend="eager"), 3)  # Dynamo calls _call_impl itself
    hook.close()
    assert hook.enabled
    assert any("without its forward being seen" in record.getMessage() for record in caplog.records)
    assert not isinstance(hook._driver.root_hooks.get(id(model)), RootCall)


def test_shims_only_where_every_compile_was_watched(tmp_path):
    """In a fresh process: none once Dynamo was imported before any hook watched torch.compile
    (something may have been compiled unseen); a hook created before that keeps shims, and so do
    hooks made after it, since every compile since has been seen."""
    script = textwrap.dedent(f"""
        import sys, torch
        from trainguard.hooks.pytorch import TorchHook
        first = TorchHook(out_dir={str(tmp_path / "a")!r})
        import torch._dynamo
        second = TorchHook(out_dir={str(tmp_path / "b")!r})
        print("watched", first._driver._root_shims, second._driver._root_shims)
        first.close(); second.close()
    """)
    late = textwrap.dedent("""
        import torch, torch._dynamo
        from trainguard.hooks import torch_root_call
        print("late", torch_root_call.shims_safe())
    """)
    outputs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
               for code in (script, late)]  # fmt: skip
    assert all(output.returncode == 0 for output in outputs), [output.stderr[-2000:] for output in outputs]
    assert "watched True True" in outputs[0].stdout
    assert "late False" in outputs[1].stdout


def test_an_optimizer_made_before_the_hook_keeps_the_shims_and_an_unheard_compile_ends_them(tmp_path):
    """Constructing an optimizer imports Dynamo (torch 2.13), and scripts make theirs before the
    hook: trainguard watches torch.compile from its import, so that hook still gets shims. A
    compile while no hook listened may have traced a root unseen: hooks after it get pre-hooks."""
    script = textwrap.dedent(f"""
        import gc, sys, torch
        from trainguard.hooks.pytorch import TorchHook
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        assert "torch._dynamo" in sys.modules
        hook = TorchHook(out_dir={str(tmp_path / "a")!r})
        print("after the optimizer", hook._driver._root_shims)
        hook.close(); del hook; gc.collect()
        compiled = torch.compile(torch.nn.Linear(4, 2))
        later = TorchHook(out_dir={str(tmp_path / "b")!r})
        print("after an unheard compile", later._driver._root_shims)
        later.close()
    """)
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert output.returncode == 0, output.stderr[-2000:]
    assert "after the optimizer True" in output.stdout and "after an unheard compile False" in output.stdout


def test_two_optimizers_on_one_backward_keep_the_shim_and_warn_nothing(make_hook, run_dir, caplog):
    """Sparse and dense parameters stepped by two optimizers after one backward: the second steps
    with no forward since the first, which is not a forward the shim missed."""
    torch.manual_seed(0)
    model = Net()
    hook = make_hook(save_config=tg.SaveConfig(save_interval=4), include_collections=["weights"])
    hook.register_module(model)
    first = torch.optim.SGD(model.body.parameters(), lr=0.05)
    second = torch.optim.SGD(model.head.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        for _ in range(6):
            first.zero_grad()
            second.zero_grad()
            model(torch.randn(5, 4)).square().mean().backward()
            first.step()
            second.step()
    assert isinstance(hook._driver.root_hooks[id(model)], RootCall)
    hook.close()
    assert hook.enabled
    assert not [record for record in caplog.records if "forward being seen" in record.getMessage()]
    assert create_trial(str(run_dir)).steps() == [0, 4]
