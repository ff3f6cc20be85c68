"""WeightUpdateRatio: ``r = ‖W_s − W_prev‖₂ / (‖W_prev‖₂ + epsilon)`` per weight tensor; fire if
``r > large_threshold`` or ``r < small_threshold``.

SageMaker ``rule_to_invoke``: ``WeightUpdateRatio``; parameters ``num_steps`` (None),
``large_threshold`` (10.0), ``small_threshold`` (1e-8), ``epsilon`` (1e-9), as documented.
Tensors: the ``weights`` collection (PyTorch ``*.weight``; biases are excluded because a
zero-initialised bias makes any first update "infinitely" large). Only TRAIN steps are used
when the run has any (weights do not move during evaluation), else every step. W_prev is the
tensor's previous saved step in that mode; with ``num_steps`` it is the earliest saved step
whose mode step is ≥ s − num_steps (the window must hold at least one earlier step).
Non-finite weights or updates count as an infinitely large update.
"""

from __future__ import annotations

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import (
    as_float,
    earlier_steps,
    fmt,
    is_complete,
    read_values,
    select,
    training_mode,
)
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.params import Param


def _as_real(value: np.ndarray) -> np.ndarray | None:
    """Floats keep their precision (float32 weights stay float32: half the memory traffic)."""
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        return array.ravel()
    converted = as_float(array)
    return None if converted is None else converted.ravel()


def _norm(array: np.ndarray) -> float:
    """L2 norm accumulated in float64 (a float32 dot product loses digits over many elements)."""
    with np.errstate(all="ignore"):
        if array.dtype == np.float64:
            return float(np.sqrt(np.dot(array, array)))
        return float(np.sqrt(np.einsum("i,i->", array, array, dtype=np.float64)))


class WeightUpdateRatio(Rule):
    """Weight updates far too large or far too small for the weights they change."""

    rule_name = "WeightUpdateRatio"
    collections = ("weights",)
    fix_hint = "check the learning rate"
    large_hint = "lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_)"
    small_hint = (
        "raise the learning rate, lower weight decay, and check that the parameters are given to the "
        "optimizer and have requires_grad=True"
    )

    num_steps = Param(
        int,
        None,
        "compare with the weights at most this many steps earlier",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )
    large_threshold = Param(float, 10.0, "fire when update/weight norm ratio is above this")
    small_threshold = Param(float, 1e-8, "fire when update/weight norm ratio is below this")
    epsilon = Param(float, 1e-9, "added to the weight norm against division by zero")

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        # name -> (step, values, their L2 norm): the current step is the next step's previous one
        self._cache: dict[str, tuple[int, np.ndarray, float]] = {}

    def validate(self) -> None:
        from trainguard.errors import ConfigError

        if self.small_threshold >= self.large_threshold:
            raise ConfigError(f"{self.name()}: small_threshold must be < large_threshold")

    def _previous(self, name: str, step: int, mode: ModeKeys) -> int | None:
        trial = self.base_trial

        def in_mode(p: int) -> bool:
            return mode == ModeKeys.GLOBAL or trial.mode(p) == mode

        if self.num_steps is None:
            found = earlier_steps(trial, name, step, in_mode, limit=1)
            return found[0] if found else None
        number = (lambda p: p) if mode == ModeKeys.GLOBAL else trial.mode_step
        oldest = number(step) - self.num_steps
        window = earlier_steps(trial, name, step, in_mode, stop=lambda p: number(p) < oldest)
        return window[-1] if window else None

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        mode = training_mode(trial)
        if mode != ModeKeys.GLOBAL and trial.mode(step) != mode:
            return None
        names = select(self, step, collections=["weights"])
        if not names:
            if trial.training_ended and not trial.tensor_names(collection="weights"):
                return self.missing(step, MissingTensor("weights", "weights"))
            return None
        current = read_values(trial, names, step)
        previous_steps = {name: self._previous(name, step, mode) for name in current}
        to_read: dict[int, list[str]] = {}
        previous: dict[str, tuple[np.ndarray, float]] = {}
        for name, prev in previous_steps.items():
            if prev is None:
                continue
            cached = self._cache.get(name)
            if cached is not None and cached[0] == prev:
                previous[name] = (cached[1], cached[2])
            else:
                to_read.setdefault(prev, []).append(name)
        for prev, group in to_read.items():
            for name, value in read_values(trial, group, prev).items():
                before = _as_real(value)
                if before is not None:
                    previous[name] = (before, _norm(before))
        ratios: dict[str, float] = {}

        def measure(name: str, value: np.ndarray) -> tuple[np.ndarray, float, float | None] | None:
            array = _as_real(value)
            if array is None:
                return None
            norm = _norm(array)
            if name not in previous or previous[name][0].shape != array.shape or array.size == 0:
                return array, norm, None
            before, before_norm = previous[name]
            with np.errstate(all="ignore"):
                ratio = _norm(array - before) / (before_norm + self.epsilon)
            return array, norm, ratio if np.isfinite(ratio) else float("inf")

        for name, measured in map_tensors(measure, current).items():  # numpy work on two cores
            if measured is None:
                continue
            array, norm, ratio = measured
            self._cache[name] = (step, array, norm)
            if ratio is not None:
                ratios[name] = ratio
        if not ratios:
            return None
        large = {name: r for name, r in ratios.items() if r > self.large_threshold}
        small = {name: r for name, r in ratios.items() if r < self.small_threshold}
        if large or small:
            # too large wins: a diverging update is the more urgent of the two
            direction, found = ("large", large) if large else ("small", small)
            name = (max if large else min)(found, key=found.__getitem__)
            ratio, before = found[name], previous_steps[name]
            size = f"{fmt(ratio)} times" if large else f"only {fmt(ratio)} of"
            threshold = self.large_threshold if large else self.small_threshold
            return self.issue(
                step,
                f"update of {name} is {size} its norm (step {before} → {step}); {direction}_threshold {fmt(threshold)}",
                fix_hint=self.large_hint if large else self.small_hint,
                tensor=name,
                ratio=ratio,
                direction=direction,
                previous_step=before,
                ratios=ratios,
            )
        return self.no_issue(step, min_ratio=min(ratios.values()), max_ratio=max(ratios.values()))
