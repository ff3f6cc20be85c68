"""What the usual unsaved step reads, in one small object of its own.

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
"""

from __future__ import annotations

from collections.abc import Sized

from trainguard.config.collections import Collection

__all__ = ["EndsQuietRuns", "QuietRun"]


class QuietRun:
    """A run of TRAIN steps that certainly save nothing, and the step-end signal.

    ``left``: steps of the run not yet begun (0: the next step takes the general path).
    ``pending``: an optimizer stepped since the last root forward (the step ends at the next
    one); set by the optimizer's post-hook, or by the C callables that stand in for it during a
    run (torch_optimizer.py). ``collections`` and ``count``: the hook's list of included
    collections and its length when the run was counted."""

    __slots__ = ("left", "pending", "collections", "count")

    def __init__(self) -> None:
        self.left = 0
        self.pending = False
        self.collections: Sized = ()
        self.count = 0

    def begin(self, steps: int, collections: Sized) -> None:
        self.left = steps
        self.collections = collections
        self.count = len(collections)

    def end(self) -> None:
        """Something the run was counted under changed: the next step takes the general path.
        (From another thread, e.g. a writer that disables capture, the training thread may
        count on to the run's end: those steps save nothing either.)"""
        self.left = 0


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
