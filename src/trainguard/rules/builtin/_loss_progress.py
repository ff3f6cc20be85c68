"""Whether the training loss fell between two saved steps, for rules that judge an update by its
size: a large update that made the loss fall is learning, however large it is.

The test is the rank one LossNotDecreasing calls certain, on few values: every training loss saved
after the earlier step, up to the later one (the last ``SAMPLES``), is below every loss saved at or
before the earlier step (the last ``SAMPLES`` of those). One lucky batch does not pass it; a loss
that only wobbles passes it by chance with probability 1 / C(a + b, a) (1/20 for three against
three). Several loss tensors (a GAN's): every one of them must have fallen. No loss saved on
either side: not known (None), and the caller judges the update alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.builtin._helpers import earlier_steps, read_values

__all__ = ["LossProgress"]

SAMPLES = 3  # losses on each side of the comparison


class LossProgress:
    """Reads a run's training losses (cached per tensor and step) to say whether they fell."""

    def __init__(self, trial: Any) -> None:
        self._trial = trial
        self._values: dict[tuple[str, int], float] = {}

    def fell(self, earlier: int, later: int, mode: ModeKeys) -> bool | None:
        """Every loss tensor's last saved values after ``earlier`` up to ``later`` are all below
        its last ones at or before ``earlier`` (global steps, ``mode``'s steps only)."""
        trial = self._trial
        if "losses" not in trial.collections():
            return None
        names = trial.tensor_names(collection="losses")
        verdicts = [self._fell_one(name, earlier, later, mode) for name in names]
        known = [verdict for verdict in verdicts if verdict is not None]
        return all(known) if known else None

    def _fell_one(self, name: str, earlier: int, later: int, mode: ModeKeys) -> bool | None:
        trial = self._trial

        def in_mode(p: int) -> bool:
            return mode == ModeKeys.GLOBAL or trial.mode(p) == mode

        after = earlier_steps(trial, name, later + 1, in_mode, stop=lambda p: p <= earlier, limit=SAMPLES)
        before = earlier_steps(trial, name, earlier + 1, in_mode, limit=SAMPLES)
        recent = [self._value(name, p) for p in after]
        reference = [value for p in before if math.isfinite(value := self._value(name, p))]
        if not recent or not reference:
            return None
        # a non-finite recent loss fails the comparison (nan < x is False): that run did not learn
        return all(value < min(reference) for value in recent)

    def _value(self, name: str, step: int) -> float:
        """The loss's mean at ``step``; NaN when not readable there."""
        key = (name, step)
        if key not in self._values:
            value = read_values(self._trial, [name], step).get(name)
            with np.errstate(all="ignore"):
                number = float(np.mean(value)) if value is not None and np.size(value) else math.nan
            self._values[key] = number
        return self._values[key]
