"""Steps that save nothing cost no per-module Python: module forward hooks exist on saved steps only.
Under torch.compile a saved step runs the model eagerly and an unsaved one runs the graph Dynamo
traced without any hook of ours: no graph break, same names and values as eager."""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import optimizer as torch_optim_module

import trainguard.pytorch as tg
from trainguard.hooks import torch_optimizer
from trainguard.hooks.torch_root_call import RootCall
from trainguard.hooks.zero_code import ZeroCodeHook
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


def test_compiled_model_captures_every_saved_step(make_hook, run_dir):
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


# -- what an unsaved step costs, and torch.compile -----------------------------------------------

# Callbacks that run per module or per parameter: none may run on a step that saves nothing.
PER_MODULE_CALLBACKS = {"_after_forward", "_capture_after_forward", "capture_module_io", "_global_pre_forward",
                        "_global_forward", "_capture", "hook", "_push_module", "_pop_module"}  # fmt: skip


def _mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(4, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


def _trainguard_calls(
    model: nn.Module, steps: int, criterion: nn.Module | None = None, only_ours: bool = True
) -> list[collections.Counter]:
    """The trainguard Python functions called during each training step (a profiler per step);
    ``only_ours`` False: every Python function, PyTorch's and the standard library's too."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = criterion or nn.CrossEntropyLoss()
    per_step = []
    for _ in range(steps):
        calls: collections.Counter = collections.Counter()

        def profile(frame, event, arg, calls=calls):
            if event == "call" and (not only_ours or f"{os.sep}trainguard{os.sep}" in frame.f_code.co_filename):
                calls[frame.f_code.co_name] += 1

        x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
        sys.setprofile(profile)
        try:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
        finally:
            sys.setprofile(None)
        per_step.append(calls)
    return per_step


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_unsaved_steps_call_no_per_module_python(make_hook, tmp_path, zero_code, compiled):
    """On a step that saves nothing only the step bookkeeping runs: the same few calls whatever the
    model's size, and not one per module or parameter (save_all, so every module would capture)."""
    torch._dynamo.reset()
    counts = []
    for depth in (1, 6):
        torch.manual_seed(0)
        model = _mlp(8, depth)
        hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / f"depth{depth}"),
                         save_config=tg.SaveConfig(save_interval=4), save_all=True)  # fmt: skip
        if not zero_code:
            hook.register_module(model)
            hook.register_loss(nn.CrossEntropyLoss())
        per_step = _trainguard_calls(torch.compile(model, backend="eager") if compiled else model, 8)
        hook.close()
        assert hook.enabled
        saved = [per_step[step] for step in (0, 4)]
        unsaved = [per_step[step] for step in (2, 3, 6, 7)]  # steps 1 and 5 end (write) steps 0 and 4
        for calls in saved:  # the saved steps do capture per module
            assert calls["capture_module_io"] >= 2 * depth + 1
        for calls in unsaved:
            assert not PER_MODULE_CALLBACKS & set(calls), calls
            assert sum(calls.values()) <= 40, calls
        counts.append(sum(unsaved[0].values()))
    assert counts[0] == counts[1]  # independent of the number of modules


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_compiled_model_has_no_graph_break_and_saves_what_eager_saves(make_hook, tmp_path, zero_code):
    """Dynamo traces the model once, without any hook of ours (no graph break on any step, saved
    steps run eagerly); every tensor name and value equals an eager run's, training unchanged."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    reference_model = _mlp(8, 2)
    state = reference_model.state_dict()

    def run(kind: str) -> list[float]:
        model = _mlp(8, 2)
        model.load_state_dict(state)
        hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / kind),
                         save_config=tg.SaveConfig(save_interval=3), save_all=True)  # fmt: skip
        if not zero_code:
            hook.register_module(model)
        torch.manual_seed(5)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        runnable = torch.compile(model, backend="eager") if kind == "compiled" else model
        losses = []
        for _ in range(7):
            loss = F.cross_entropy(runnable(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        hook.close()
        assert hook.enabled
        return losses

    eager_losses = run("eager")
    torch._dynamo.reset()
    counters.clear()
    assert run("compiled") == eager_losses
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    eager, compiled = create_trial(str(tmp_path / "eager")), create_trial(str(tmp_path / "compiled"))
    assert compiled.steps() == eager.steps() == [0, 3, 6]
    names = eager.tensor_names()
    assert compiled.tensor_names() == names
    assert {"0_output_0", "1_output_0", "gradient/Sequential_0.weight"} <= set(names)
    for name in names:
        for step in eager.tensor(name).steps():
            np.testing.assert_array_equal(compiled.tensor(name).value(step), eager.tensor(name).value(step))


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_disabled_capture_removes_every_per_step_hook(make_hook, monkeypatch, zero_code, compiled):
    """An internal error during a saved step disables capture; from the next forward on, no hook of
    ours is left to call (training then runs as without trainguard), and training is unchanged."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _mlp(8, 2)
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, save_config=tg.SaveConfig(save_interval=2),
                     save_all=True)  # fmt: skip
    if not zero_code:
        hook.register_module(model)

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(type(hook), "capture_module_io", broken)
    per_step = _trainguard_calls(torch.compile(model, backend="eager") if compiled else model, 5)
    assert not hook.enabled
    assert all(not module._forward_hooks for module in model.modules())
    assert not any(parameter._post_accumulate_grad_hooks for parameter in model.parameters())
    assert not torch.nn.modules.module._global_forward_hooks
    for calls in per_step[2:]:
        # one check each: the root's (or wrapper's) pre-hook, the two global optimizer hooks and,
        # zero-code, the wrapped functional losses and Tensor.backward
        assert not PER_MODULE_CALLBACKS & set(calls) and sum(calls.values()) <= 6, calls


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_losses_only_steps_make_no_per_parameter_calls(make_hook, tmp_path, zero_code):
    """A saved step whose due collections hold no parameter or gradient (losses only: what an
    overhead budget keeps most often) walks no parameter. Steps that save gradients (here every
    third) save every one, and no step calls Python per parameter in the backward: an optimizer
    steps, so gradients are read as it does (torch_optimizer.py)."""
    for depth in (1, 6):
        torch.manual_seed(0)
        model = _mlp(8, depth)
        out_dir = tmp_path / f"depth{depth}"
        hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(out_dir),
                         save_config=tg.SaveConfig(save_interval=1),
                         include_collections=["losses", "gradients"])  # fmt: skip
        hook.get_collection("gradients").save_config = tg.SaveConfig(save_interval=3)
        criterion = nn.CrossEntropyLoss()
        if not zero_code:
            hook.register_module(model)
            hook.register_loss(criterion)
        per_step = _trainguard_calls(model, 8, criterion)
        hook.close()
        assert hook.enabled
        for step in (4, 7):  # gradients due at 3 and 6
            assert per_step[step]["_save_due"] <= 3, per_step[step]
        for step in range(8):
            assert per_step[step]["hook"] == 0, per_step[step]
        for step in (3, 6):
            assert per_step[step]["_take_applied_gradients"] == 1, per_step[step]
        trial = create_trial(out_dir)
        assert trial.steps() == list(range(8))
        loss_name = trial.tensor_names(collection="losses")[0]
        assert all(np.isfinite(trial.tensor(loss_name).value(step)).all() for step in range(8))
        gradient_names = trial.tensor_names(collection="gradients")
        assert len(gradient_names) == 2 * (depth + 1)
        assert all(trial.tensor(name).steps() == [0, 3, 6] for name in gradient_names)


def _ends_through_optimizer(hook: tg.Hook, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s own _optimizer_step_code ends the hook's steps (and not the
    global optimizer post-hook, which is then away)."""
    ours = hook._post_hook in torch_optim_module._global_optimizer_post_hooks.values()
    assert ours != ("_optimizer_step_code" in vars(optimizer))  # the one or the other
    return not ours


def test_an_only_optimizer_ends_unsaved_steps_and_is_left_as_it_was(make_hook, tmp_path):
    """During a run of unsaved steps the run's only optimizer tells of each step's end (a C
    callable as its _optimizer_step_code); a validation forward and close() bring the global
    post-hook back, no run of unsaved steps that begins under PyTorch's profiler (which watches
    that method) uses it, and the optimizer is left as it was made."""
    torch.manual_seed(0)
    model = _mlp(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = make_hook(tg.Hook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=10),
                     include_collections=["losses"])  # fmt: skip
    hook.register_module(model)
    hook.register_loss(criterion := nn.CrossEntropyLoss())
    through_optimizer = []
    with contextlib.ExitStack() as profiling:
        for step in range(30):
            if step == 19:
                profiling.enter_context(torch.profiler.profile())
            optimizer.zero_grad()
            criterion(model(torch.randn(3, 4)), torch.randint(0, 2, (3,))).backward()
            optimizer.step()
            through_optimizer.append(_ends_through_optimizer(hook, optimizer))
            if step == 24:
                profiling.close()
            if step == 4:  # validation in the middle of a run of unsaved steps
                model.eval()
                with torch.no_grad():
                    model(torch.randn(3, 4))
                assert not _ends_through_optimizer(hook, optimizer)
                model.train()
    hook.close()
    assert hook.enabled
    assert "_optimizer_step_code" not in vars(optimizer)
    assert hook._post_hook not in torch_optim_module._global_optimizer_post_hooks.values()
    # unsaved steps end through the optimizer, saved ones (begun in the general path, as is the
    # first after the validation forward, which begins a new run) do not; from step 21 on,
    # a run begun under the profiler, none
    assert through_optimizer[:10] == [False] + [True] * 9
    assert through_optimizer[10:21] == [False] + [True] * 9 + [False]
    assert through_optimizer[21:] == [False] * 9
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=tg.ModeKeys.TRAIN) == [0, 10, 20]
    assert hook.mode_steps[tg.ModeKeys.TRAIN] == 29  # the last of 30 (signal or not: checked)
    assert hook.mode_steps[tg.ModeKeys.EVAL] == 0  # the validation forward


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_a_run_without_an_optimizer_hooks_each_gradient_node_to_copy_it_before_it_is_zeroed(
    make_hook, tmp_path, monkeypatch, zero_code
):
    """With no optimizer to step, a step ends at the next forward, after the loop has applied and
    zeroed its gradients by hand: those are copied as autograd accumulates them, through a hook
    on each parameter's gradient node (the one kind of run that gets them)."""
    real = torch_optimizer.AccumulationHook
    created = []

    def counting(*args):
        created.append(args[0])
        return real(*args)

    monkeypatch.setattr(torch_optimizer, "AccumulationHook", counting)
    torch.manual_seed(0)
    model = _mlp(8, 1)
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / "run"),
                     save_config=tg.SaveConfig(save_interval=1), include_collections=["gradients"])  # fmt: skip
    if not zero_code:
        hook.register_module(model)
    expected = []
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.randint(0, 2, (3,)))
        loss.backward()
        expected.append({name: p.grad.detach().clone().numpy() for name, p in model.named_parameters()})
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.1 * parameter.grad
                parameter.grad = None
    hook.close()
    assert {id(parameter) for parameter in created} == {id(parameter) for parameter in model.parameters()}
    trial = create_trial(tmp_path / "run")
    names = trial.tensor_names(collection="gradients")
    assert len(names) == len(list(model.parameters()))
    for name in names:
        parameter_name = name.removeprefix("gradient/").split("_", 1)[1]
        for step, gradients in enumerate(expected):
            np.testing.assert_array_equal(trial.tensor(name).value(step), gradients[parameter_name])


# Once per run of unsaved steps, at its last step (the next may be saved), the zero-code hook puts
# its functional-loss and backward wrappers back on (_end_quiet_window: the Dynamo-skipping wrapper,
# fail_open, the two methods, SwappedAttributes.put_on) and that step's loss and backward pass
# through them: in ``F.cross_entropy(model(x), y)`` the function is looked up before the forward.
WINDOW_END_CALLS = 10


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_an_unsaved_step_runs_a_few_python_calls_more_than_without_trainguard(make_hook, tmp_path, zero_code):
    """What an unsaved step costs is Python calls (a profile of the bench MLP's 0.8 ms step: the
    interpreter's share of the step rose 8 % -> 3.6 % of the step under the hook, 28 calls more).
    Counted whole, PyTorch's and the standard library's included: the root's call shim, its
    check written out in it (torch_root_call.py: the root carries no forward hook, so
    Module.__call__ keeps its fast path); no Dynamo wrapper around it. The step's end is told by
    the optimizer's ``_optimizer_step_code``, set to a C callable (torch_optimizer.py): the
    Python method PyTorch calls there otherwise is one call fewer, so the step runs as many
    Python calls as without trainguard. (The global optimizer post-hook, one more, ran on these
    steps until 2026-11-29; the check as a call of its own cost 1 more until 2026-11-28; where
    torch.compile may have run unwatched, the root's pre-hook instead: 3 more, the slow path of
    Module.__call__ and the check; a Dynamo wrapper 5 more; the
    optimizer pre-hook, one more, exists only on steps saving gradients since 2026-11-28, and
    the zero-code wrappers of Tensor.backward and the functional losses, two more, only on
    saved steps since 2026-11-28.)"""
    torch.manual_seed(0)
    model = _mlp(8, 2)
    plain_calls = _trainguard_calls(model, 6, only_ours=False)
    plain = [sum(calls.values()) for calls in plain_calls]
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / "run"),
                     save_config=tg.SaveConfig(save_interval=4), include_collections=["losses"])  # fmt: skip
    if not zero_code:
        hook.register_module(model)
    hooked_calls = _trainguard_calls(model, 8, only_ours=False)
    hooked = [sum(calls.values()) for calls in hooked_calls]
    shimmed = isinstance(hook._driver.root_hooks.get(id(model)), RootCall)
    hook.close()
    assert len(set(plain[2:])) == 1, plain  # the same calls every step once warm
    assert plain_calls[-1]["_optimizer_step_code"] == 1
    for step in (1, 2, 3, 5, 6, 7):  # from the unsaved step that begins a run of them
        assert not {"_after_optimizer_step", "_optimizer_step_code"} & set(hooked_calls[step]), hooked_calls[step]
    for step in (2, 6):  # unsaved, after an unsaved one (1 and 5 end the saved 0 and 4)
        assert hooked[step] - plain[-1] <= (0 if shimmed else 3), (step, hooked, plain, shimmed)
    for step in (3, 7):  # the last before a saved one: zero-code puts its loss wrappers back on
        more = WINDOW_END_CALLS if zero_code else 0
        assert hooked[step] - plain[-1] <= (0 if shimmed else 3) + more, (step, hooked, plain, shimmed)
    for step in (0, 4):  # saved: the post-hook is back (the general path began them)
        assert hooked_calls[step]["_after_optimizer_step"] == 1, (step, hooked_calls[step])


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_an_unsaved_compiled_step_runs_the_shim_only(make_hook, tmp_path, zero_code):
    """A torch.compile'd model's steps begin at its OptimizedModule wrapper, whose call shim
    (torch_root_call.py) sits where Module.__call__ looks first: an unsaved step runs the shim
    and, in place of PyTorch's own ``Optimizer._optimizer_step_code`` method, a C callable (the
    test above): as many Python calls as the same compiled model without trainguard (two more
    until 2026-11-29: the shim and the optimizer post-hook), and the wrapper carries no forward
    hook (a pre-hook there cost 3: the slow path of Module.__call__, the pre-hook and its check)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _mlp(8, 2)
    compiled = torch.compile(model, backend="eager")
    plain = [sum(calls.values()) for calls in _trainguard_calls(compiled, 6, only_ours=False)]
    hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / "run"),
                     save_config=tg.SaveConfig(save_interval=4), include_collections=["losses"])  # fmt: skip
    criterion = nn.CrossEntropyLoss()
    if not zero_code:
        hook.register_module(compiled)
        hook.register_loss(criterion)
    hooked_calls = _trainguard_calls(compiled, 8, criterion, only_ours=False)
    hooked = [sum(calls.values()) for calls in hooked_calls]
    shims = list(hook._driver._wrapper_shims)
    hook.close()
    assert hook.enabled
    assert len(shims) == 1 and shims[0].module() is compiled
    assert not compiled._forward_pre_hooks and not model._forward_pre_hooks
    assert "_compiled_call_impl" not in compiled.__dict__  # close() took the shim away
    assert len(set(plain[2:])) == 1, plain
    for step in (2, 6):  # unsaved, after an unsaved one
        assert hooked[step] == plain[-1], (step, hooked, plain)
        assert hooked_calls[step]["root_call"] == 1 and not hooked_calls[step]["_optimizer_step_code"]
    for step in (3, 7):  # the last before a saved one (see the test above)
        assert 0 <= hooked[step] - plain[-1] <= (WINDOW_END_CALLS if zero_code else 0), (step, hooked, plain)
    assert create_trial(str(tmp_path / "run")).steps() == [0, 4]


def test_a_wrapper_shim_that_is_never_called_gives_way_to_a_pre_hook(make_hook, tmp_path, caplog):
    """Should a torch version's OptimizedModule.__call__ not reach the shim's slot, the model's
    forwards go unseen: the run's only optimizer then steps twice without one, and the wrapper
    gets a forward pre-hook instead (with a warning): later steps are counted and saved."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _mlp(8, 2)
    compiled = torch.compile(model, backend="eager")
    hook = make_hook(tg.Hook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2),
                     include_collections=["losses"])  # fmt: skip
    hook.register_module(compiled)
    hook.register_loss(criterion := nn.CrossEntropyLoss())
    del compiled.__dict__["_compiled_call_impl"]  # the shim bypassed, as such a __call__ would
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with caplog.at_level("WARNING", logger="trainguard"):
        for _ in range(6):
            optimizer.zero_grad()
            criterion(compiled(torch.randn(3, 4)), torch.randint(0, 2, (3,))).backward()
            optimizer.step()
    hook.close()
    assert hook.enabled
    assert "without its forward being seen" in caplog.text
    assert not hook._driver._wrapper_shims
    steps = create_trial(str(tmp_path / "run")).steps()
    assert steps and len(steps) >= 2 and all(step % 2 == 0 for step in steps), steps


def test_no_shim_where_torch_has_no_slot_for_it(monkeypatch):
    """torch < 2.2's Module.__call__ has no ``_compiled_call_impl`` to consult: a shim written
    there would never run, so none is installed (the root then gets a pre-hook)."""
    from trainguard.hooks.torch_root_call import install_root_call

    def make_call(module, call_impl):
        return lambda *args, **kwargs: call_impl(*args, **kwargs)

    assert install_root_call(_mlp(4, 1), make_call) is not None
    monkeypatch.setattr(torch.nn.Module, "_compiled_call_impl", "not a slot", raising=True)
    assert install_root_call(_mlp(4, 1), make_call) is None


def _compiled_after_six_steps(make_hook, run_dir, zero_code: bool | None, save_interval: int, steps: int) -> dict:
    """Train the test MLP for ``steps`` steps, compiled (Dynamo, eager backend) before the
    seventh, under the zero-code or the API hook (``zero_code`` None: no hook). Returns its
    losses, per step whether the hook drives the model from its compiled wrapper, the unsaved
    steps left in the hook's run as it was compiled, and the steps it counted."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _mlp(8, 2)
    criterion = nn.CrossEntropyLoss()
    hook = None
    if zero_code is not None:
        schedule = tg.SaveConfig(save_interval=save_interval)
        hook_class = ZeroCodeHook if zero_code else tg.Hook
        hook = make_hook(hook_class, out_dir=str(run_dir), save_config=schedule, include_collections=["losses"])
        if not zero_code:
            hook.register_module(model)
            hook.register_loss(criterion)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    eager_model = model
    found: dict = {"losses": [], "from_wrapper": []}
    for step in range(steps):
        if step == 6:
            found["left_at_compile"] = hook._quiet.left if hook is not None else None
            model = torch.compile(model, backend="eager")
        x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        found["losses"].append(loss.item())
        found["from_wrapper"].append(hook is not None and id(eager_model) in hook._driver.wrapped_roots)
    if hook is not None:
        found["counted"] = hook.step
        hook.close()
        assert hook.enabled
    return found


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_a_model_compiled_after_its_eager_steps_keeps_training_and_capture(make_hook, tmp_path, zero_code):
    """The root's pre-hook carries no Dynamo wrapper (skip_in_dynamo): when the model is compiled
    after it ran eagerly, Dynamo meets the hook inside the traced forward and must break the graph
    there, not trace our bookkeeping: the losses are those of the same run without trainguard
    and the steps after compiling are still counted and saved."""
    hooked = _compiled_after_six_steps(make_hook, tmp_path / "run", zero_code, save_interval=4, steps=16)
    assert hooked["losses"] == _compiled_after_six_steps(make_hook, None, None, save_interval=4, steps=16)["losses"]
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 4, 8, 12]
    losses = trial.tensor_names(collection="losses")
    assert losses and all(trial.tensor(name).steps() == [0, 4, 8, 12] for name in losses)


@pytest.mark.parametrize("zero_code", [True, False], ids=["zero_code", "api"])
def test_compiling_a_model_ends_its_run_of_unsaved_steps(make_hook, tmp_path, zero_code):
    """A run of unsaved steps spans up to 1,024 steps, during which the root's pre-hook (it
    replaces the shim when torch.compile is called) breaks a compiled model's graph: compiling
    cuts the run short, and the hook drives the model from its compiled wrapper two steps on.
    The loss series is that of the run without trainguard; steps go on being counted."""
    hooked = _compiled_after_six_steps(make_hook, tmp_path / "run", zero_code, save_interval=10**6, steps=12)
    assert hooked["left_at_compile"] > 100  # in a long run of unsaved steps
    assert hooked["losses"] == _compiled_after_six_steps(make_hook, None, None, save_interval=10**6, steps=12)["losses"]
    assert hooked["from_wrapper"] == [False] * 7 + [True] * 5  # the second step after compiling
    assert hooked["counted"] == 11


class Branchy(nn.Module):
    """A head used only on even steps: its parameters get no gradient on odd ones."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 4)
        self.use_aux = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.body(x)
        return self.aux(x) if self.use_aux else x


@pytest.mark.parametrize("order", ["zero_first", "zero_after_forward", "zero_in_place"])
@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_an_optimizer_driven_run_hooks_no_parameter_and_saves_each_steps_gradients(
    make_hook, tmp_path, monkeypatch, zero_code, order
):
    """Gradients saved every step, read as the optimizer steps, of exactly the parameters the
    step gave one, whatever the order of zero_grad and forward and whether gradients are set to
    None; and no parameter or its gradient node ever carries a hook: a post-accumulate-grad hook
    once added, or a hook on the AccumulateGrad node even after it was removed (that node lives on
    while the last step's graph does), leaves a call into Python per parameter on every later
    backward."""
    created = []
    monkeypatch.setattr(torch_optimizer, "AccumulationHook", lambda *args: created.append(args))

    def run(hooked: bool) -> dict[tuple[str, int], np.ndarray]:
        torch.manual_seed(0)
        model = Branchy()
        hook = None
        if hooked:
            hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / "run"),
                             save_config=tg.SaveConfig(save_interval=1), include_collections=["gradients"])  # fmt: skip
            if not zero_code:
                hook.register_module(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        to_none = order != "zero_in_place"
        gradients = {}
        for step in range(6):
            model.use_aux = step % 2 == 0
            if order != "zero_after_forward":
                optimizer.zero_grad(set_to_none=to_none)
            output = model(torch.randn(3, 4)).square().mean()
            if order == "zero_after_forward":  # Lightning's closure: training_step, zero_grad, backward
                optimizer.zero_grad(set_to_none=True)
            output.backward()
            for name, parameter in model.named_parameters():
                if parameter.grad is not None and (model.use_aux or not name.startswith("aux")):
                    gradients[(name, step)] = parameter.grad.detach().clone().numpy()
            optimizer.step()
            if hooked:
                assert all(parameter._post_accumulate_grad_hooks is None for parameter in model.parameters())
        if hook is not None:
            hook.close()
            assert hook.enabled
        return gradients

    expected = run(False)
    assert run(True).keys() == expected.keys()  # the same training, hooked
    assert created == []
    trial = create_trial(str(tmp_path / "run"))
    found = {}
    for tensor_name in trial.tensor_names(collection="gradients"):
        parameter_name = tensor_name.removeprefix("gradient/").split("_", 1)[1]
        for step in trial.tensor(tensor_name).steps():
            found[(parameter_name, step)] = trial.tensor(tensor_name).value(step)
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(found[key], value, err_msg=str(key))


def test_zero_code_loss_wrappers_exist_around_saved_steps_only_and_capture_every_saved_loss(make_hook, tmp_path):
    """F.cross_entropy and torch.autograd.backward are PyTorch's own on unsaved steps (two Python
    calls less) and trainguard's during saved ones and the last step before each (a script may
    look the function up before the forward that begins a saved step), and torch.Tensor is never
    edited (a class attribute set would invalidate Python's caches for every tensor): every saved
    step has both losses, the one backward started from equal to the loss the script computed."""
    torch.manual_seed(0)
    model = _mlp(8, 2)
    original_loss, original_backward = F.cross_entropy, torch.autograd.backward
    tensor_backward = torch.Tensor.__dict__["backward"]
    hook = make_hook(ZeroCodeHook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=3),
                     include_collections=["losses"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ours, losses, functional = [], [], []
    for _ in range(10):
        optimizer.zero_grad()
        output = model(torch.randn(3, 4))  # the step begins here: its wrappers are (not) there now
        ours.append((F.cross_entropy is not original_loss, torch.autograd.backward is not original_backward))
        assert torch.Tensor.__dict__["backward"] is tensor_backward
        cross_entropy = F.cross_entropy(output, torch.randint(0, 2, (3,)))
        loss = cross_entropy + 0.1 * output.square().mean()  # backward starts from another tensor
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        functional.append(cross_entropy.item())
    hook.close()
    assert ours == [(step % 3 != 1, step % 3 != 1) for step in range(10)], ours
    assert (F.cross_entropy, torch.autograd.backward) == (original_loss, original_backward)
    trial = create_trial(tmp_path / "run")
    saved = [0, 3, 6, 9]
    for name, expected in (("loss_cross_entropy_output_0", functional), ("loss_backward_output_0", losses)):
        tensor = trial.tensor(name)
        assert tensor.steps() == saved, name
        assert [float(tensor.value(step)) for step in saved] == pytest.approx([expected[s] for s in saved]), name


def test_a_functional_loss_called_on_the_forward_is_captured_on_every_saved_step(make_hook, tmp_path):
    """``F.cross_entropy(model(x), y)``: Python looks the function up before the forward that
    begins the step runs, so the wrapper must already be there when a saved step begins. Every
    saved step then has the loss under its functional name, with its predictions and labels, and
    none under the name of a loss known only from backward (as step 0 alone had until 2026-11-29:
    the loss series split between two names)."""
    torch.manual_seed(0)
    model = _mlp(8, 2)
    hook = make_hook(ZeroCodeHook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=5),
                     include_collections=["losses", "predictions", "labels"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(23):
        optimizer.zero_grad()
        labels = torch.randint(0, 2, (3,))
        loss = F.cross_entropy(model(torch.randn(3, 4)), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    hook.close()
    assert hook.enabled
    trial = create_trial(tmp_path / "run")
    saved = [0, 5, 10, 15, 20]
    assert trial.steps() == saved
    assert trial.tensor_names(collection="losses") == ["loss_cross_entropy_output_0"]
    loss = trial.tensor("loss_cross_entropy_output_0")
    assert [float(loss.value(step)) for step in loss.steps()] == pytest.approx([losses[s] for s in saved])
    for name in ("loss_cross_entropy_input_0", "loss_cross_entropy_input_1"):
        assert trial.tensor(name).steps() == saved, name


def test_a_patch_another_library_makes_between_saved_steps_is_kept(make_hook, tmp_path):
    """A library that replaces F.mse_loss while trainguard's wrapper is off (an unsaved step) keeps
    its replacement through later saved steps and the hook's close."""
    torch.manual_seed(0)
    model = _mlp(8, 2)
    original = F.mse_loss
    hook = make_hook(ZeroCodeHook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=4),
                     include_collections=["losses"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def patched(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    try:
        for step in range(9):
            optimizer.zero_grad()
            output = model(torch.randn(3, 4))
            if step == 1:  # unsaved: F.mse_loss is PyTorch's now
                assert F.mse_loss is original
                F.mse_loss = patched
            loss = F.mse_loss(output, torch.zeros(3, 2))
            loss.backward()
            optimizer.step()
        assert F.mse_loss is patched  # steps 4 and 8 saved: not replaced by trainguard's wrapper
        hook.close()
        assert F.mse_loss is patched and len(calls) == 8
    finally:
        F.mse_loss = original


@pytest.mark.parametrize("call", ["method", "function", "keyword", "list"])
def test_zero_code_backward_loss_found_however_backward_is_called(make_hook, tmp_path, call):
    """The loss a backward starts from is captured through torch.autograd.backward, which
    ``loss.backward()`` calls and scripts may call directly (a tensor, ``tensors=``, a list)."""
    torch.manual_seed(0)
    model = _mlp(8, 2)
    hook = make_hook(ZeroCodeHook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2),
                     include_collections=["losses"])  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(3, 4)).square().mean()
        if call == "method":
            loss.backward()
        elif call == "function":
            torch.autograd.backward(loss)
        elif call == "keyword":
            torch.autograd.backward(tensors=loss)
        else:
            torch.autograd.backward([loss])
        optimizer.step()
        losses.append(loss.item())
    hook.close()
    tensor = create_trial(tmp_path / "run").tensor("loss_backward_output_0")
    assert tensor.steps() == [0, 2]
    np.testing.assert_allclose([tensor.value(step) for step in (0, 2)], [losses[0], losses[2]], rtol=1e-6)


def test_the_call_shim_decides_every_step_as_quiet_step_does(make_hook):
    """The root's call shim carries _quiet_step's check written out (one Python frame less per
    unsaved step): over every combination of the state it reads, it takes the quiet path exactly
    when _quiet_step would, leaves the same state behind, and otherwise calls the root pre-hook."""
    import itertools

    from trainguard.modes import ModeKeys

    model = _mlp(4, 1)
    hook = make_hook(tg.Hook, save_config=tg.SaveConfig(save_interval=10**6))
    calls: list[str] = []
    hook._driver._root_pre_hook = lambda module, args: calls.append("general")
    hook._driver._eager_end_quiet_window = lambda: calls.append("mark")
    root_call = hook._driver._root_call(model, lambda *args, **kwargs: calls.append("call_impl"))
    quiet_run = hook._quiet
    combinations = itertools.product((0, 1, 3), (False, True), (0, 1), (False, True), (False, True), (None, object()))
    quiet_taken = 0
    for left, pending, added, training, grad, budget in combinations:
        outcomes = []
        for through_shim in (True, False):
            quiet_run.begin(left, hook.include_collections)
            quiet_run.pending = pending
            quiet_run.count -= added  # a collection appended to the list since the run was counted
            hook._budget, hook.step = budget, 7
            hook.mode_steps[ModeKeys.TRAIN] = 5
            model.train(training)
            calls.clear()
            with torch.set_grad_enabled(grad):
                if through_shim:
                    root_call("x")
                    quiet = "general" not in calls
                    assert calls[-1] == "call_impl"
                else:
                    quiet = hook._driver.quiet_step(model)
            outcomes.append((quiet, quiet_run.left, quiet_run.pending, hook.step, hook.mode_steps[ModeKeys.TRAIN],
                             calls.count("mark")))  # fmt: skip
        assert outcomes[0] == outcomes[1], (left, pending, added, training, grad, budget)
        quiet_taken += outcomes[0][0]
    assert quiet_taken == 2 * 2  # left 1 or 3, budget or none: every other check must pass
    hook._budget = None


def _into_a_run_of_unsaved_steps(hook: tg.Hook, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    assert hook._quiet.left > 100


@pytest.mark.parametrize("change", ["disable", "set_mode", "get_collection", "add_collection", "save_scalar",
                                    "append_collection", "torch.compile"])  # fmt: skip
def test_a_change_to_what_a_run_of_unsaved_steps_was_counted_under_ends_it(make_hook, tmp_path, change):
    """The unsaved step's check reads only the run's own small object (quiet_run.py): whatever
    else the run was counted under ends it where it changes, and the next step takes the general
    path (after torch.compile, the one after: that step is still counted as unsaved)."""
    from trainguard.config.collections import Collection
    from trainguard.modes import ModeKeys

    torch.manual_seed(0)
    model = _mlp(4, 1)
    hook = make_hook(tg.Hook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=10**6),
                     include_collections=["losses"])  # fmt: skip
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    _into_a_run_of_unsaved_steps(hook, model, optimizer)
    if change == "disable":
        hook.disable("a test")
    elif change == "set_mode":
        hook.set_mode(ModeKeys.TRAIN)
    elif change == "get_collection":
        hook.get_collection("losses")
    elif change == "add_collection":
        hook.add_collection(Collection("extra"))
    elif change == "save_scalar":
        hook.save_scalar("lr", 0.01)
    elif change == "append_collection":
        hook.include_collections.append("weights")
    else:
        torch.compile(model, backend="eager")
    if change != "append_collection":  # (a list mutated in place is noticed at the next step)
        assert hook._quiet.left == (1 if change == "torch.compile" else 0)
    general = []
    original = hook._root_step
    hook._root_step = lambda module: (general.append(hook.step), original(module))
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    if change == "disable":
        assert not hook.enabled and hook._driver.released  # the general path took the hooks away
    elif change == "set_mode":
        assert general == [2, 3]  # a mode set by the script: no runs of unsaved steps from then on
    else:
        assert general == ([3] if change == "torch.compile" else [2])
    hook.close()
