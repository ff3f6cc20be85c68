"""Sharing tensor reads between the rules that evaluate the same step.

The default rules read overlapping tensors (ExplodingTensor reads everything, VanishingGradient
and PoorWeightInitialization the gradients, WeightUpdateRatio the weights of this step and the
previous one). Every read goes through ``Trial._read_values``; the runner puts this cache in
front of it so each tensor of a step is read and decoded once, whoever asks (for ``s3://`` runs
that is one GET instead of one per rule).

Callers get their own copy of each array, so a rule that changes an array in place cannot
change what the next rule sees.
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
        return {name: np.array(entry[name], copy=True) for name in names}
