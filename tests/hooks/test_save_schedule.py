"""How far ahead nothing is saved: computed from one configured step to the next, it must agree
with asking the schedule about every step (what it did before, 256 tests per count)."""

from __future__ import annotations

import random

import pytest

import trainguard.pytorch as tg
from trainguard.config.save_config import SaveConfigMode
from trainguard.hooks.overhead_budget import OverheadBudget
from trainguard.modes import ModeKeys


def _random_schedule(draw: random.Random) -> SaveConfigMode:
    interval = draw.choice([None, 1, 2, 7, 10, 50, 1000])
    start = draw.choice([0, 0, 3, 40])
    end = draw.choice([None, None, 5, 120, 700])
    steps = tuple(sorted(draw.sample(range(400), draw.choice([0, 0, 1, 5]))))
    return SaveConfigMode(interval, start, end, steps)


def test_the_next_saved_step_is_the_first_one_should_save_says_yes_to():
    draw = random.Random(7)
    for _ in range(300):
        schedule = _random_schedule(draw)
        for step in range(-1, 450):
            expected = next((later for later in range(step + 1, 2000) if schedule.should_save(later)), None)
            if expected is None:
                # beyond 2,000 only an open-ended interval saves again: its next multiple
                assert schedule.next_save(step) is None or schedule.next_save(step) >= 2000, (schedule, step)
            else:
                assert schedule.next_save(step) == expected, (schedule, step)


def _ahead_step_by_step(hook, mode: ModeKeys, mode_step: int, limit: int = 256) -> int:
    """The schedule asked about every step, as unsaved_steps_ahead did before."""
    groups = hook._schedule_groups()
    ahead = 0
    while ahead < limit:
        step = mode_step + ahead + 1
        if any(schedule.should_save_step(mode, step) for schedule, _ in groups):
            if (hook._budget is None or mode is not ModeKeys.TRAIN) or hook._due_collections(mode, step):
                break
        ahead += 1
    return ahead


@pytest.mark.parametrize("budget", [False, True], ids=["schedule", "thinned_by_a_budget"])
def test_unsaved_steps_ahead_agrees_with_asking_every_step(tmp_path, budget):
    draw = random.Random(11)
    for case in range(40):
        hooks = []
        for twin in range(2):  # one asked each way; a budget remembers what it was asked
            hook = tg.Hook(out_dir=str(tmp_path / f"{case}-{twin}"), save_config=tg.SaveConfig(save_interval=10),
                           include_collections=["losses", "weights", "gradients"])  # fmt: skip
            local = random.Random(case)
            for name in ("weights", "gradients"):
                schedule = _random_schedule(local)
                if schedule.effective_interval is not None or schedule.save_steps:
                    hook.get_collection(name).save_config = tg.SaveConfig(
                        save_interval=schedule.save_interval, start_step=schedule.start_step,
                        end_step=schedule.end_step, save_steps=list(schedule.save_steps) or None)  # fmt: skip
            if budget:
                hook._budget = OverheadBudget(0.01)
                hook._budget.light_stride, hook._budget.heavy_stride = 3, 2
            hooks.append(hook)
        try:
            step = -1
            while step < 1500:
                limit = draw.choice([5, 256])
                fast = hooks[0].unsaved_steps_ahead(ModeKeys.TRAIN, step, limit)
                slow = _ahead_step_by_step(hooks[1], ModeKeys.TRAIN, step, limit)
                assert fast == slow, (case, step, limit)
                step += fast + 1
                for hook in hooks:  # the step saved (or the limit reached): decided for both alike
                    hook._due_collections(ModeKeys.TRAIN, step)
        finally:
            for hook in hooks:
                hook.close()
