"""The PyTorch hook's usual unsaved step, and what it reads, in one small object of its own.

A PyTorch hook's unsaved step runs one Python function of ours, the root's call shim
(torch_root_call.py), whose check asks whether the step is the next of a run of steps the
schedule saves nothing in. That check used to read a dozen slots of the hook object. Measured
inside a training step (bench/RESULTS.md, "The unsaved step's check") it cost more than
twice what a shim that only passes the call on costs, although each read alone takes nanoseconds:
between two calls of the shim, the step's tensors and PyTorch's own code push our objects out of
the CPU's caches, and the hook's slots lie on many cache lines. The same check reading this
object's few slots costs about half as much.

So the run's facts live here, and everything that used to be re-checked at each step instead
ends the run where it changes (:meth:`QuietRun.end`): a step that begins (it computes the next
run), the hook's mode set, capture disabled, collections or schedules changed, an unscheduled
save, torch.compile called. Only a list of included collections mutated in place cannot say so:
its length is compared at each step, as the schedule's own cache does (SaveSchedule).
Nor does the step write the hook's step counters: they are brought up to date whenever read
(:class:`CountsQuietSteps`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sized
from typing import Any

import torch

from trainguard.config.collections import Collection
from trainguard.hooks.base import BaseHook
from trainguard.hooks.fail_open import fail_open
from trainguard.hooks.overhead_budget import QUIET
from trainguard.modes import ModeKeys

__all__ = ["CountsQuietSteps", "EndsQuietRuns", "QuietRun", "UnsavedSteps"]

# The unsaved step's check reads this as a global: ``torch.is_grad_enabled`` is an attribute of
# a module, one lookup more at every execution.
_is_grad_enabled = torch.is_grad_enabled

_TRAIN = ModeKeys.TRAIN
# BaseHook's own slots, which CountsQuietSteps' properties of the same names shadow
_STEP_SLOT = BaseHook.step
_MODE_STEPS_SLOT = BaseHook.mode_steps


class QuietRun:
    """A run of TRAIN steps that certainly save nothing, and the step-end signal.

    ``left``: steps of the run not yet begun (0: the next step takes the general path); the
    usual unsaved step only counts it down. ``pending``: an optimizer stepped since the last root
    forward (the step ends at the next one); set by the optimizer's post-hook, or by the C
    callables that stand in for it during a run (torch_optimizer.py). ``collections`` and
    ``count``: the hook's list of included collections and its length when the run was counted.

    The hook's step counters are not written at each unsaved step: a write there is an int
    allocated (past 256) and the hook's object and its dict of mode steps pulled back into the
    caches, about 0.4 % of the bench MLP's step in one process (bench/RESULTS.md, "Steps
    counted when read"). The steps the run has begun since they were last counted are
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


class EndsQuietRuns:
    """The hook's public calls that change what a run of unsaved steps was counted under end it
    (TorchHook's; placed before BaseHook, whose methods do the work)."""

    _quiet: QuietRun

    def disable(self, reason: BaseException | str) -> None:
        self._quiet.end()  # the next step takes the general path, which takes the hooks away
        super().disable(reason)  # type: ignore[misc]

    def get_collection(self, name: str) -> Collection:
        self._quiet.end()  # the caller may change the collection's schedule or patterns
        return super().get_collection(name)  # type: ignore[misc, no-any-return]

    def add_collection(self, collection: Collection) -> None:
        self._quiet.end()
        super().add_collection(collection)  # type: ignore[misc]


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
        return _STEP_SLOT.__get__(self)  # type: ignore[no-any-return]

    @step.setter
    def step(self, value: int) -> None:
        self._take_quiet_steps()  # into mode_steps too, before the step is overwritten
        _STEP_SLOT.__set__(self, value)

    @property
    def mode_steps(self) -> dict[ModeKeys, int]:
        self._take_quiet_steps()
        return _MODE_STEPS_SLOT.__get__(self)  # type: ignore[no-any-return]

    @mode_steps.setter
    def mode_steps(self, value: dict[ModeKeys, int]) -> None:
        self._take_quiet_steps()
        _MODE_STEPS_SLOT.__set__(self, value)


class UnsavedSteps:
    """TorchHook's unsaved step: the root's pre-hook asks :meth:`_quiet_step`, a call shim has
    the same check written out (:meth:`_call_shim`); either counts the step down and returns, or
    the step takes the general path."""

    _quiet: QuietRun
    _budget: Any
    _eager_end_quiet_window: Callable[[], None]
    _root_pre_hook: Callable[[torch.nn.Module, Any], None]
    step: int

    def _quiet_step(self, module: torch.nn.Module) -> bool:
        """Count the usual unsaved step and say so; False for every other step.

        The usual unsaved step: an optimizer-driven TRAIN step after one that saved nothing,
        whose number the schedule was already asked about (begin_step), with the model in
        training mode and gradients on. The root's pre-hook runs this first, before any other
        call (a few attribute checks, no allocation), and the general path would come to the
        same state. What else the run was counted under (mode, capture enabled, collections,
        no unscheduled save) ends the run where it changes (quiet_run.py). The call shims have
        this written out (:meth:`_call_shim`): change both. A model compiled after it ran
        eagerly is noticed at the next step that takes the general path (torch.compile ends the
        run of unsaved steps: the second step after it).
        """
        quiet = self._quiet
        if not (
            quiet.left
            and quiet.pending
            and len(quiet.collections) == quiet.count
            and module.training
            and _is_grad_enabled()
        ):
            return False
        quiet.left -= 1  # the step counted (CountsQuietSteps adds it to step and mode_steps)
        quiet.pending = False
        if not quiet.left and (self._budget is not None or self._ends_quiet_windows):
            self._eager_end_quiet_window()
        return True

    def _root_call(self, module: torch.nn.Module, call_impl: Callable[..., Any]) -> Callable[..., Any]:
        """The body of a root's call shim (torch_root_call.py): its steps begin at its own call."""
        return self._call_shim(module, module, call_impl, self._root_pre_hook)

    def _call_shim(
        self,
        root: torch.nn.Module,
        called: torch.nn.Module,
        call_impl: Callable[..., Any],
        general: Callable[[torch.nn.Module, Any], None],
    ) -> Callable[..., Any]:
        """A call shim for ``called`` (the root itself, or the ``OptimizedModule`` wrapping it,
        torch_compiled.py) that drives ``root``'s steps: :meth:`_quiet_step` written out in it, so
        that the usual unsaved step runs one Python frame of ours fewer (in a training loop a call
        of ours costs about 1 us, ten times what it costs alone: bench/RESULTS.md), and
        ``general(called, args)`` on every other step. The two must agree (tested)."""
        hook = self
        quiet = self._quiet  # read through the closure: the hook object's slots stay untouched
        # The shim is kept in the module's own __dict__: holding the module here (or its bound
        # _call_impl) would be a reference cycle that keeps a model the script dropped alive until
        # the hook's close or a garbage collection. A DDP model's Reducer holds the process
        # group, whose destruction then happens in trainguard's close at interpreter exit, with
        # the GIL held, where it can deadlock with a gloo thread that needs the GIL (issue 48).
        called_ref = weakref.ref(called)
        root_ref = called_ref if root is called else weakref.ref(root)
        if getattr(call_impl, "__self__", None) is called:
            function = call_impl.__func__  # type: ignore[attr-defined]
        else:  # not the module's own bound method (none of ours): held as given

            def function(_module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
                return call_impl(*args, **kwargs)

        def root_call(*args: Any, **kwargs: Any) -> Any:
            module = called_ref()  # alive: it is being called
            if (
                quiet.left
                and quiet.pending
                and len(quiet.collections) == quiet.count
                and root_ref().training  # type: ignore[union-attr]
                and _is_grad_enabled()
            ):
                quiet.left -= 1
                quiet.pending = False
                if not quiet.left and (hook._budget is not None or hook._ends_quiet_windows):
                    hook._eager_end_quiet_window()
            else:
                general(module, args)  # type: ignore[arg-type]
            return function(module, *args, **kwargs)

        return root_call

    @fail_open
    def _end_quiet_window(self) -> None:
        """The last step of a run of unsaved ones has begun: the next may be saved."""
        if self._budget is not None:
            self._budget.mark(self.step, QUIET)  # its span is one step of training
        self._before_possibly_saved_step()

    # Whether _before_possibly_saved_step does anything (else the window's end is only the
    # budget's business, and costs no call without one)
    _ends_quiet_windows = False

    def _before_possibly_saved_step(self) -> None:
        """Called at the last step of a run of certainly unsaved steps (ZeroCodeHook's)."""
