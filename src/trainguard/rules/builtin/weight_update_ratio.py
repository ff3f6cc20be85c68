"""WeightUpdateRatio: ``r = ‖W_s − W_prev‖₂ / (‖W_prev‖₂ + epsilon)`` per weight tensor; fire if
``r > large_threshold`` or ``r < small_threshold``.

SageMaker ``rule_to_invoke``: ``WeightUpdateRatio``; parameters ``num_steps`` (None),
``large_threshold`` (10.0), ``small_threshold`` (1e-8), ``epsilon`` (1e-9), as documented.
Tensors: the ``weights`` collection (PyTorch: ``*.weight`` and every other trainable parameter
not named a bias, docs/format.md; biases are excluded because a zero-initialised bias makes any
first update "infinitely" large). Only TRAIN steps are used
when the run has any (weights do not move during evaluation), else every step. W_prev is the
tensor's previous saved step in that mode; with ``num_steps`` it is the earliest saved step
whose mode step is ≥ s − num_steps (the window must hold at least one earlier step).
Non-finite weights or updates count as an infinitely large update.

Calibrated semantics (default): W_prev is the weights ``window − 1`` saved steps earlier (the
oldest saved step in the window when fewer were saved; ``num_steps`` still overrides it), so the
ratio is the drift over the window — one step's ratio swings with its batch, a diverging or a
frozen weight does not. A tensor fires when its ratio was too large at 2 of its
last ``window`` evaluations, or too small at most of them (certain: all of a full window), or
exactly unchanged, bit for bit, at two evaluations running over at least ``NOT_MOVED_STEPS``
training steps (no optimizer step moved it: nothing noisy to wait out); \
a non-finite update fires at once and
is certain. Weights that get no gradient by construction are never "too small": frozen ones
(the run saved gradients, none for this weight), those whose gradient is all zero at this
step (all-zero inputs), and those that got no gradient at any step of the span while those
steps saved other weights' gradients (trained in another phase: layer-wise training). A weight
that was all zero at the reference step is not judged (no scale: LoRA's zero-initialised B,
zero-init residual branches). ``semantics="sagemaker"``: the previous
saved step, single-step condition.

A too-large ratio while the training loss fell is learning, not a learning rate too high: a weight
initialised far below the scale it converges to (a regression from a small init fitting
coefficients of about 5: the first window's update is hundreds of times the initial norm) moves
many times its own norm while the loss falls fast. So a finite too-large ratio counts only where
the loss did not fall over the same span: the fall is the rank test of ``_loss_progress`` (every
training loss saved after the reference step, up to the last three, below every one of the last
three saved at or before it). Where no loss was saved, the ratio is judged alone, as before. What
this cannot tell apart: a learning rate too high whose loss still falls over most compared spans
(that regression at 100 times its learning rate: loss 22 -> 4-50, weights oscillating at their
scale, ratios below 4 once grown) is not reported here; the loss rules and ExplodingTensor judge
that run. Non-finite updates and too-small ratios are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import (
    as_float,
    earlier_steps,
    fmt,
    is_complete,
    read_values,
    saved_at,
    select,
    training_mode,
)
from trainguard.rules.builtin._loss_progress import LossProgress
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin._persistence import PersistentRule
from trainguard.rules.params import Param

# Training steps an exactly unchanged weight must span before two evaluations suffice: longer than
# the steps a mixed-precision loss scaler skips at a run's start, or a warm-up's first step at 0
NOT_MOVED_STEPS = 8


def _as_real(value: np.ndarray) -> np.ndarray | None:
    """Floats keep their precision (float32 weights stay float32: half the memory traffic)."""
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        return array.ravel()
    converted = as_float(array)
    return None if converted is None else converted.ravel()


def _at_or_before(reference: int) -> Callable[[int], bool]:
    """Where a walk back from a later step ends: at the reference step or before it."""
    return lambda p: p <= reference


def _norm(array: np.ndarray) -> float:
    """L2 norm accumulated in float64 (a float32 dot product loses digits over many elements)."""
    with np.errstate(all="ignore"):
        if array.dtype == np.float64:
            return float(np.sqrt(np.dot(array, array)))
        return float(np.sqrt(np.einsum("i,i->", array, array, dtype=np.float64)))


class WeightUpdateRatio(PersistentRule):
    """Weight updates far too large or far too small for the weights they change."""

    rule_name = "WeightUpdateRatio"
    collections = ("weights",)
    needs = "no weights were saved at two training steps"
    stop_policy = (
        "stops training at a non-finite update, or when the ratio was out of bounds at every evaluation of "
        "a full window; SageMaker semantics never stop"
    )
    fix_hint = "check the learning rate"
    large_hints = {
        "pytorch": "lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_)",
        "keras": "lower the learning rate or clip gradients (optimizer clipnorm=1.0)",
        "xgboost": "lower eta",
    }
    small_hints = {
        "pytorch": (
            "raise the learning rate, lower weight decay, and check that the parameters are given to the "
            "optimizer and have requires_grad=True"
        ),
        "keras": "raise the learning rate, lower weight decay, and check that the layers are trainable",
        "xgboost": "raise eta",
    }
    large_hint = "lower the learning rate or clip gradients"
    small_hint = "raise the learning rate, lower weight decay, and check that the parameters are being trained"

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
        self._progress = LossProgress(self.base_trial)

    def _not_moved(self, name: str, ratio: float, step: int, previous_steps: dict[str, int | None]) -> bool:
        """A weight bit for bit what it was at two evaluations running, across at least
        ``NOT_MOVED_STEPS`` training steps: no optimizer step moved it, which no batch's noise
        explains (a too-small but nonzero ratio waits for most of the window)."""
        reference = previous_steps.get(name)
        if ratio != 0.0 or reference is None or self.persistence.count((name, "small")) < 2:
            return False
        trial = self.base_trial
        return trial.mode_step(step) - trial.mode_step(reference) >= NOT_MOVED_STEPS

    def validate(self) -> None:
        from trainguard.errors import ConfigError

        if self.small_threshold >= self.large_threshold:
            raise ConfigError(f"{self.name()}: small_threshold must be < large_threshold")

    def _previous(self, name: str, step: int, mode: ModeKeys) -> int | None:
        trial = self.base_trial

        def in_mode(p: int) -> bool:
            return mode == ModeKeys.GLOBAL or trial.mode(p) == mode

        if self.num_steps is None:
            back = 1 if self.single_step else max(1, self.window - 1)
            found = earlier_steps(trial, name, step, in_mode, limit=back)
            return found[-1] if found else None
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
            if trial.training_ended and not (
                "weights" in trial.collections() and trial.tensor_names(collection="weights")
            ):
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
            if before_norm == 0 and not self.single_step and np.isfinite(norm):
                # a weight that was all zero has no scale to compare its update with: zero-initialised
                # on purpose (LoRA's B, zero-init residual branches); all-zero init of the whole
                # model is PoorWeightInitialization's and AllZero's finding
                return array, norm, None
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
        certain = False
        if not self.single_step:
            if large:
                large = self._unless_learning(large, previous_steps, step, mode)
            if small:
                without = self._without_gradient(list(small), step, mode, previous_steps)
                small = {name: r for name, r in small.items() if name not in without}
            immediate = {name: r for name, r in large.items() if r == float("inf")}  # non-finite
            # one persistence update per tensor and direction per evaluated step
            held = {name: (name in large, name in small) for name in ratios}
            # A drift of ten times a weight's own norm never comes from one unlucky batch (the ratio is
            # taken over the window, not one step): two evaluations showing it are enough to report
            # it; a too-small update is the quiet failure and needs most of the window.
            fire = {
                name: (
                    self.persisted((name, "large"), is_large, needed=2)[0],
                    self.persisted((name, "small"), is_small)[0],
                )
                for name, (is_large, is_small) in held.items()
            }
            large = {name: r for name, r in large.items() if fire[name][0]}
            small = {
                name: r for name, r in small.items() if fire[name][1] or self._not_moved(name, r, step, previous_steps)
            }
            certain = bool(immediate) or any(
                self.persistence.confirmed((name, "large" if name in large else "small")) for name in {**large, **small}
            )
            large.update(immediate)
        if large or small:
            # too large wins: a diverging update is the more urgent of the two
            direction, found = ("large", large) if large else ("small", small)
            name = (max if large else min)(found, key=found.__getitem__)
            ratio, reference_step = found[name], previous_steps[name]
            size = f"{fmt(ratio)} times" if large else f"only {fmt(ratio)} of"
            threshold = self.large_threshold if large else self.small_threshold
            framework = self.framework() or ""
            hint = (
                self.large_hints.get(framework, self.large_hint)
                if large
                else self.small_hints.get(framework, self.small_hint)
            )
            how_long = (
                "" if self.single_step or ratio == float("inf") else f" {self.persistence_text((name, direction))}"
            )
            return self.issue(
                step,
                f"update of {name} is {size} its norm (step {reference_step} → {step}){how_long}; "
                f"{direction}_threshold {fmt(threshold)}",
                fix_hint=hint,
                certain=certain,
                tensor=name,
                ratio=ratio,
                direction=direction,
                previous_step=reference_step,
                ratios=ratios,
            )
        return self.no_issue(step, min_ratio=min(ratios.values()), max_ratio=max(ratios.values()))

    def _unless_learning(
        self, large: dict[str, float], previous_steps: dict[str, int | None], step: int, mode: ModeKeys
    ) -> dict[str, float]:
        """The too-large ratios that count: non-finite ones, and finite ones over a span in which
        the training loss did not fall (see the module's docstring)."""
        fell: dict[int, bool | None] = {}
        kept = {}
        for name, ratio in large.items():
            reference = previous_steps[name]
            if ratio != float("inf") and reference is not None:
                if reference not in fell:
                    fell[reference] = self._progress.fell(reference, step, mode)
                if fell[reference]:
                    continue
            kept[name] = ratio
        return kept

    def _without_gradient(
        self, names: list[str], step: int, mode: ModeKeys, previous_steps: dict[str, int | None]
    ) -> set[str]:
        """Weights whose tiny update has no gradient to blame (by construction): frozen (the run
        saved gradients, none for this weight), or an all-zero gradient at every saved step from
        the reference step up to this one (no signal: all-zero inputs). A weight with a non-zero
        gradient that did not move is the fault (learning rate 0, not given to the optimizer)."""
        trial = self.base_trial
        saved = set(trial.tensor_names(collection="gradients")) if "gradients" in trial.collections() else set()
        if not saved:
            return set()  # the run saved no gradients: cannot tell frozen from not updated
        weights = trial.tensor_names(collection="weights") if "weights" in trial.collections() else []
        if not any(f"gradient/{weight}" in saved for weight in weights):
            return set()  # no weight of the model gets a gradient: report it
        excused = {name for name in names if f"gradient/{name}" not in saved}
        for name in names:
            reference = previous_steps.get(name)
            if name in excused or reference is None:
                continue
            gradient = f"gradient/{name}"
            between = [reference] + earlier_steps(
                trial,
                gradient,
                step,
                lambda p: mode == ModeKeys.GLOBAL or trial.mode(p) == mode,
                stop=_at_or_before(reference),
            )
            span = sorted(set(between))
            values = [read_values(trial, [gradient], p).get(gradient) for p in span]
            present = [value for value in values if value is not None]
            if present and not any(np.any(np.asarray(value)) for value in present):
                excused.add(name)
            elif not present and all(self._saved_other_gradients(gradient, saved, p) for p in span):
                # trained in another phase of the run only: while these steps saved other
                # weights' gradients, it got none (a forward-forward net trains layer by layer)
                excused.add(name)
        return excused

    def _saved_other_gradients(self, gradient: str, saved: set[str], step: int) -> bool:
        trial = self.base_trial
        return any(saved_at(trial, other, step) for other in saved if other != gradient)
