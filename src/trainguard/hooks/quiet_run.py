"""The PyTorch hook's run of unsaved steps, and what the unsaved step reads, in one small object.

The unsaved step's check (step_driver.py) asks whether the step is the next of a run of steps the
schedule saves nothing in. It reads this object's few slots, not the hook's many: between two
checks the step's tensors and PyTorch's own code push trainguard's objects out of the CPU's
caches, and every cache line read costs.

So the run's facts live here, and everything that would otherwise be re-checked at each step
instead ends the run where it changes (:meth:`QuietRun.end`): a step that begins (it computes the
next run), the hook's mode set, capture disabled, collections or schedules changed, an unscheduled
save, torch.compile called. Only a list of included collections mutated in place cannot say so:
its length is compared at each step, as the schedule's own cache does (SaveSchedule).
Nor does the step write the hook's step counters: they are brought up to date whenever read
(:class:`CountsQuietSteps`).
"""

from __future__ import annotations

import threading
from collections.abc import Sized
from typing import Any

from trainguard.hooks.base import BaseHook
from trainguard.modes import ModeKeys

__all__ = ["CountsQuietSteps", "QuietRun"]

_TRAIN = ModeKeys.TRAIN
# BaseHook's own slots, which CountsQuietSteps' properties of the same names shadow
_STEP_SLOT: Any = BaseHook.__dict__["step"]
_MODE_STEPS_SLOT: Any = BaseHook.__dict__["mode_steps"]


class QuietRun:
    """A run of TRAIN steps that certainly save nothing, and the step-end signal.

    ``left``: steps of the run not yet begun (0: the next step takes the general path); the
    usual unsaved step only counts it down. ``pending``: an optimizer stepped since the last root
    forward (the step ends at the next one); set by the optimizer's post-hook, or by the C
    callables that stand in for it during a run (torch_optimizer.py). ``collections`` and
    ``count``: the hook's list of included collections and its length when the run was counted.

    The hook's step counters are not written at each unsaved step: a write there is an int
    allocated (past 256) and the hook's object and its dict of mode steps pulled back into the
    caches. The steps the run has begun since they were last counted are
    ``counted_from - left``; :meth:`take` hands them over (TorchHook's ``step`` and
    ``mode_steps`` take them whenever they are read).

    ``removed``: the steps the run lost to :meth:`shorten` since it began, so that the step a
    count of ``left`` stands for stays known: the run's ``steps - removed - left``-th step (0: the
    step that began it), which the step sentinel reads (sentinel.py)."""

    __slots__ = ("left", "pending", "collections", "count", "counted_from", "removed", "_counting")

    def __init__(self) -> None:
        self.left = 0
        self.removed = 0
        self.pending = False
        self.collections: Sized = ()
        self.count = 0
        self.counted_from = 0
        # take() may be called from other threads (anything that reads the hook's step); the
        # unsaved step itself never takes this lock: it only counts ``left`` down
        self._counting = threading.Lock()

    def begin(self, steps: int, collections: Sized) -> None:
        with self._counting:
            self.counted_from += steps - self.left  # steps begun and not yet taken stay to be taken
            self.left = steps
            self.removed = 0
        self.collections = collections
        self.count = len(collections)

    def end(self) -> None:
        """Something the run was counted under changed: the next step takes the general path.
        (From another thread, e.g. a writer that disables capture, the training thread may
        count on to the run's end: those steps save nothing either.)"""
        self.shorten(0)

    def shorten(self, steps: int) -> None:
        """At most ``steps`` more unsaved steps in this run."""
        with self._counting:
            left = self.left
            if left > steps:
                self.counted_from -= left - steps
                self.removed += left - steps
                self.left = steps

    def take(self) -> int:
        """The steps begun since the last call (``left`` read once: the training thread may
        begin one meanwhile, which the next call counts)."""
        with self._counting:
            left = self.left
            begun = self.counted_from - left
            self.counted_from = left
        return begun


class CountsQuietSteps:
    """The hook's ``step`` and ``mode_steps`` (BaseHook's slots) with the unsaved steps a run
    has begun since they were last read added, so that every reader, ours or the script's,
    sees the steps counted as if each step had written them (QuietRun says why it does not).
    Placed before BaseHook: its ``__init__`` sets both through these properties."""

    _quiet: QuietRun

    def _take_quiet_steps(self) -> None:
        begun = self._quiet.take()
        if begun:
            _STEP_SLOT.__set__(self, _STEP_SLOT.__get__(self) + begun)
            _MODE_STEPS_SLOT.__get__(self)[_TRAIN] += begun

    @property
    def step(self) -> int:
        self._take_quiet_steps()
        return _STEP_SLOT.__get__(self)

    @step.setter
    def step(self, value: int) -> None:
        self._take_quiet_steps()  # into mode_steps too, before the step is overwritten
        _STEP_SLOT.__set__(self, value)

    @property
    def mode_steps(self) -> dict[ModeKeys, int]:
        self._take_quiet_steps()
        return _MODE_STEPS_SLOT.__get__(self)

    @mode_steps.setter
    def mode_steps(self, value: dict[ModeKeys, int]) -> None:
        self._take_quiet_steps()
        _MODE_STEPS_SLOT.__set__(self, value)
