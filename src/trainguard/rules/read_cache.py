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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["StepReadCache"]


class StepReadCache:
    """Installs itself on ``trial`` (instance attribute); keeps the last ``steps`` steps read."""

    def __init__(self, trial: Any, steps: int = 3) -> None:
        self._read: Callable[..., dict[str, np.ndarray]] = trial._read_values
        self._steps = steps
        self._cache: OrderedDict[tuple[Any, ...], dict[str, np.ndarray]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.share_read_only = False
        trial._read_values = self.read_values

    def read_values(self, names: list[str], step: int, mode: Any, worker: str | None) -> dict[str, np.ndarray]:
        key = (step, mode, worker)
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
            while len(self._cache) > self._steps:
                self._cache.popitem(last=False)
        if self.share_read_only:
            return {name: _read_only_view(entry[name]) for name in names}
        return {name: np.array(entry[name], copy=True) for name in names}


def _read_only_view(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view
