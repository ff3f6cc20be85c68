"""Sharing tensor reads between the rules that evaluate the same step.

The default rules read overlapping tensors (ExplodingTensor reads everything, VanishingGradient
and PoorWeightInitialization the gradients, WeightUpdateRatio the weights of this step and the
previous one). Every read goes through ``Trial._read_values``; the runner puts this cache in
front of it so each tensor of a step is read and decoded once, whoever asks (for ``s3://`` runs
that is one GET instead of one per rule).

Callers get their own copy of each array, so a rule that changes an array in place cannot
change what the next rule sees — except where the runner vouches for the caller
(``share_read_only``: the built-in rules, which never write into what they read): those get
read-only views of the one decoded array, which saves a copy of every tensor per rule.

Rules that need the same statistic of a tensor (whether it is all finite: ExplodingTensor,
VanishingGradient and PoorWeightInitialization each ask) share it through :func:`shared_stat`,
kept next to the cached value and evicted with it. A statistic depends only on the tensor's
saved value, which never changes once written, so sharing it changes no rule's result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from trainguard.modes import ModeKeys

__all__ = ["StepReadCache", "shared_stat"]


class StepReadCache:
    """Installs itself on ``trial`` (instance attribute); keeps the last ``steps`` steps read."""

    def __init__(self, trial: Any, steps: int = 3) -> None:
        self._read: Callable[..., dict[str, np.ndarray]] = trial._read_values
        self._steps = steps
        self._cache: OrderedDict[tuple[Any, ...], dict[str, np.ndarray]] = OrderedDict()
        self._stats: dict[tuple[Any, ...], dict[tuple[str, str], Any]] = {}
        self.hits = 0
        self.misses = 0
        self.share_read_only = False
        self._workers: set[str | None] = set()
        trial._read_values = self.read_values

    def read_values(self, names: list[str], step: int, mode: Any, worker: str | None) -> dict[str, np.ndarray]:
        key = (step, mode, worker)
        # Rules run once per worker: keep ``steps`` steps of every worker, or the second
        # worker's reads would evict the first one's previous step (WeightUpdateRatio reads two).
        self._workers.add(worker)
        entry = self._cache.get(key)
        if entry is None:
            entry = {}
        else:
            self._cache.move_to_end(key)
        wanted = [name for name in names if name not in entry]
        self.hits += len(names) - len(wanted)
        self.misses += len(wanted)
        if wanted:
            fresh = self._read(wanted, step, mode, worker)  # errors propagate as without the cache
            entry.update(fresh)
            self._cache[key] = entry
            while len(self._cache) > self._steps * len(self._workers):
                evicted, _ = self._cache.popitem(last=False)
                self._stats.pop(evicted, None)
        if self.share_read_only:
            return {name: _read_only_view(entry[name]) for name in names}
        return {name: np.array(entry[name], copy=True) for name in names}

    def stat(self, step: int, mode: Any, worker: str | None, name: str, what: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per (tensor, step, ``what``) while the step's values are cached."""
        key = (step, mode, worker)
        if key not in self._cache or name not in self._cache[key]:
            return compute()  # not a value this cache holds: nothing to share it with
        stats = self._stats.setdefault(key, {})
        found = stats.get((name, what), _MISSING)
        if found is _MISSING:
            found = stats[(name, what)] = compute()
        return found


_MISSING = object()


def shared_stat(trial: Any, step: int, name: str, what: str, compute: Callable[[], Any]) -> Any:
    """A statistic ``what`` of tensor ``name`` at global ``step`` (as read by ``read_values``),
    computed once per step for every rule the runner evaluates; just ``compute()`` elsewhere."""
    # A worker's view of the trial (WorkerTrial) reads through the run's trial, keyed by worker.
    worker = getattr(trial, "bound_worker", None)
    base = getattr(trial, "base", trial) if worker is not None else trial
    cache = getattr(getattr(base, "_read_values", None), "__self__", None)
    if isinstance(cache, StepReadCache):
        return cache.stat(step, ModeKeys.GLOBAL, worker, name, what, compute)
    return compute()


def _read_only_view(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
