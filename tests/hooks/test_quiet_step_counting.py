"""Unsaved steps are counted when the hook's step is read, not written at each step
(quiet_run.py): whoever reads ``hook.step`` or ``hook.mode_steps``, whenever, sees what a hook
that counted every step on its general path sees."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

import trainguard.pytorch as tg
from trainguard.hooks.quiet_run import _STEP_SLOT
from trainguard.hooks.zero_code import ZeroCodeHook
from trainguard.modes import ModeKeys


def _script(hook: tg.Hook, steps: int) -> list[tuple[str, int, int, int]]:
    """A training loop with a validation pass every 40 steps (``model.eval()`` and no_grad, or
    no_grad alone) and scalars saved now and then; the hook's counters read after each forward,
    after some optimizer steps and after each validation forward."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    if not isinstance(hook, ZeroCodeHook):
        hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []

    def read(at: str) -> None:
        seen.append((at, hook.step, hook.mode_steps[ModeKeys.TRAIN], hook.mode_steps[ModeKeys.EVAL]))

    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(3, 4)).square().mean()
        read("forward")
        loss.backward()
        optimizer.step()
        if step % 7 == 3:
            read("optimizer")
        if step % 40 == 39:
            with torch.no_grad():
                if step % 80 == 79:
                    model.eval()
                for _ in range(3):
                    model(torch.randn(3, 4))
                    read("validation")
                model.train()
        if step % 50 == 25:
            hook.save_scalar("lr", 0.01)
    return seen


@pytest.mark.parametrize("zero_code", [False, True], ids=["api", "zero_code"])
def test_counters_read_at_any_point_equal_those_of_a_hook_counting_every_step(make_hook, tmp_path, zero_code):
    """The oracle: the same script under a hook whose runs of unsaved steps are all empty (every
    step on the general path, which counts each step as it begins)."""
    traces = []
    for runs in (True, False):
        hook = make_hook(ZeroCodeHook if zero_code else tg.Hook, out_dir=str(tmp_path / f"runs-{runs}"),
                         save_config=tg.SaveConfig(save_interval=10**6), include_collections=["losses"])  # fmt: skip
        if not runs:
            hook.unsaved_steps_ahead = lambda mode, mode_step: 0
        general = []
        original = hook._root_step
        hook._root_step = lambda module, general=general, original=original: (general.append(1), original(module))
        traces.append(_script(hook, 200))
        # with runs, the general path at saves, validations and their next steps only
        # (zero-code: the first forward is found through a global hook, not the root's)
        assert len(general) < 50 if runs else len(general) == 200 + 5 * 3 - zero_code
        hook.close()
    assert traces[0] == traces[1]
    assert traces[0][-1][1:3] == (199 + 5 * 3, 199)  # 200 training steps, 5 validations of 3 forwards


def _linear_under_a_hook(make_hook, tmp_path) -> tuple[tg.Hook, Callable[[], None]]:
    """A hook saving step 0 only and a function that trains its model one step."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    hook = make_hook(tg.Hook, out_dir=str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=10**6),
                     include_collections=["losses"])  # fmt: skip
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step() -> None:
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()

    return hook, train_step


def test_an_unsaved_step_writes_no_counter_of_the_hook(make_hook, tmp_path):
    """What makes the unsaved step cheaper: it counts its run down and touches nothing else of the
    hook (the step slot stays where it was until something reads ``hook.step``)."""
    hook, train_step = _linear_under_a_hook(make_hook, tmp_path)
    slots = []
    for _ in range(30):
        train_step()
        slots.append(_STEP_SLOT.__get__(hook))
    assert len(set(slots[5:])) == 1  # unchanged through the run
    assert hook.step == 29 and _STEP_SLOT.__get__(hook) == 29  # read: counted up to date
    hook.close()


def test_counters_read_from_another_thread_never_miss_or_double_a_step(make_hook, tmp_path):
    hook, train_step = _linear_under_a_hook(make_hook, tmp_path)
    done = threading.Event()
    read: list[int] = []

    def reader() -> None:
        while not done.wait(0.0002):  # (a reader that never waits starves training of the GIL)
            read.append(hook.step)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(2000):
            train_step()
    finally:
        done.set()
        thread.join()
    assert read == sorted(read) and len(read) > 10
    assert hook.step == 1999 and hook.mode_steps[ModeKeys.TRAIN] == 1999
    hook.close()
