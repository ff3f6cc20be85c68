"""Gradients that grow like a running sum: ``optimizer.zero_grad()`` missing, or gradients diverging.

PyTorch adds every ``backward()`` into ``.grad``. Without ``zero_grad()`` between optimizer steps
the gradient applied at step t is the sum of every batch's gradient so far, and with momentum the
update is a sum of those sums: the updates grow until the network diverges or its ReLUs die.
Dead ReLUs, a rising loss or huge updates are what other rules see *afterwards*; what the saved
gradients show first is the sum itself:

* **grown**: the norm of the gradient (every saved gradient tensor together) is at least
  ``growth`` times its norm at the run's first saved training step (nothing had accumulated
  then: it is one batch's gradient);
* **aligned**: each of the last ``window`` saved training steps' gradient points the way of the
  one saved before it, cosine >= ``alignment``. A running sum changes by one batch's gradient per
  step, a small part of what it already holds; a healthy run's fresh mini-batch gradients differ
  from batch to batch;
* **not learning**: the training loss did not fall over those steps (the rank test of
  :mod:`._loss_progress`). Gradients that grow while the loss falls are a run leaving a plateau.

The cosine is taken on a fixed strided sample of at most ``SAMPLE`` elements per tensor, so the
state kept between steps is small whatever the model's size. What this cannot tell apart: a
full-batch run whose gradient grows tenfold along one direction while its loss stays flat (a
saddle being left slowly) reads the same; a run that calls ``zero_grad()`` but diverges slowly
along one direction is reported too, which is the same advice (lower the learning rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.builtin._helpers import fmt
from trainguard.rules.builtin._loss_progress import LossProgress

__all__ = ["GradientGrowth", "SAMPLE"]

SAMPLE = 4096  # elements per gradient tensor kept for the cosine


def _sample(array: np.ndarray) -> np.ndarray:
    flat = array.ravel()
    stride = max(1, math.ceil(flat.size / SAMPLE))
    return np.asarray(flat[::stride], dtype=np.float64)


class GradientGrowth:
    """Running state of the check for one trial; :meth:`judge` is called at each saved training step."""

    def __init__(self, trial: object, growth: float, alignment: float, window: int) -> None:
        self._trial = trial
        self.growth = growth
        self.alignment = alignment
        self.window = window
        self._progress = LossProgress(trial)
        self._first_norm: float | None = None
        self._previous: dict[str, np.ndarray] | None = None
        self._recent: list[tuple[int, float, float]] = []  # (step, norm, cosine with the step before)

    def judge(self, step: int, gradients: Mapping[str, np.ndarray], mode: ModeKeys) -> dict[str, float | int] | None:
        """Facts when the gradients at ``step`` (finite, of one saved training step) hold the
        signature over the last ``window`` saved steps; None otherwise."""
        if not gradients:
            return None
        norm = math.sqrt(math.fsum(float(np.einsum("i,i->", a.ravel(), a.ravel(), dtype=np.float64))
                                   for a in gradients.values()))  # fmt: skip
        samples = {name: _sample(array) for name, array in gradients.items()}
        cosine = self._cosine(samples)
        self._previous = samples
        if self._first_norm is None:
            self._first_norm = norm
            return None
        self._recent = [*self._recent, (step, norm, cosine)][-self.window :]
        if len(self._recent) < self.window or not self._first_norm > 0:
            return None
        ratio = norm / self._first_norm
        lowest = min(item[2] for item in self._recent)
        if ratio < self.growth or lowest < self.alignment:
            return None
        since = self._recent[0][0]
        if self._progress.fell(since, step, mode) is not False:  # fell, or no loss to tell: learning
            return None
        return {"growth": ratio, "first_norm": self._first_norm, "norm": norm, "min_cosine": lowest,
                "since_step": since}

    def _cosine(self, samples: Mapping[str, np.ndarray]) -> float:
        previous = self._previous
        if previous is None:
            return -1.0
        shared = [name for name in samples if name in previous and previous[name].shape == samples[name].shape]
        if not shared:
            return -1.0
        dot = math.fsum(float(samples[name] @ previous[name]) for name in shared)
        now = math.fsum(float(samples[name] @ samples[name]) for name in shared)
        before = math.fsum(float(previous[name] @ previous[name]) for name in shared)
        if now <= 0 or before <= 0:
            return -1.0
        return dot / math.sqrt(now * before)

    def message(self, facts: Mapping[str, float | int], step: int) -> str:
        return (
            f"the gradients grow like a running sum: their norm {fmt(float(facts['norm']))} is "
            f"{fmt(float(facts['growth']))} times its value at the first saved step "
            f"({fmt(float(facts['first_norm']))}), "
            f"each of the last {self.window} saved steps' gradient points the way of the one before (cosine >= "
            f"{fmt(float(facts['min_cosine']))}), and the training loss did not fall from step {facts['since_step']} "
            f"to {step}: gradients accumulate across optimizer steps (optimizer.zero_grad() not called?) or diverge"
        )
