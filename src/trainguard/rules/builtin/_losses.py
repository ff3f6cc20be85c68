"""Shared pieces of the loss rules (LossNotDecreasing, Overfit, Underfitting, Overtraining).

Losses are scalar tensors: collection ``losses`` in PyTorch runs (``CrossEntropyLoss_output_0``,
``loss_backward_output_0``...), ``metrics`` in XGBoost runs (``train-rmse``). A saved loss that
is not a single number (``reduction='none'``) counts as its mean. Values are read once and
cached: a live rule evaluates every step and looks back at earlier ones.

Validation passes: Overfit and Overtraining compare one value per validation *pass* (the mean of
its losses, only for passes saved whole or the same first batches of each: ``_eval_passes``), so
their patience counts validation passes, not batches. :meth:`LossHistory.entries` hands them the
saved loss steps in order, with their modes and mode steps.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trainguard.errors import TrialError
from trainguard.modes import ModeKeys

# one implementation for every rule: re-exported for the loss/classification/XGBoost rules
from trainguard.rules.builtin._helpers import is_complete, read_values, saved_at

__all__ = ["LossHistory", "fmt", "is_complete", "metric_role", "parse_mode", "read_values"]


def fmt(value: float | None) -> str:
    if value is None:
        return "None"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def parse_mode(value: Any) -> ModeKeys | None:
    return None if value is None else ModeKeys.parse(value)


def scalar(value: Any) -> float | None:
    """A saved loss as one float (the mean of a non-scalar loss); None for non-numeric or empty."""
    array = np.asarray(value)
    if array.size == 0 or array.dtype.kind not in "fiub":
        return None
    with np.errstate(all="ignore"):
        return float(np.mean(array.astype(np.float64)))


_HIGHER_IS_BETTER = re.compile(r"^(auc|aucpr|ndcg|map|pre)(@|-|$)", re.IGNORECASE)
_TRAIN_DATA = re.compile(r"^(d?train|training)(_\d+)?$", re.IGNORECASE)
_VALIDATION_DATA = re.compile(r"^(d?valid|validation|val|eval|evaluation|d?test)(_\d+)?$", re.IGNORECASE)


def metric_role(name: str) -> ModeKeys | None:
    """The role of an XGBoost metric ``<data>-<metric>`` usable as a loss, or None.

    TRAIN for ``train-*``, EVAL for ``validation-*``/``eval-*``/``test-*`` (also ``validation_0``),
    None for metrics where higher is better (auc, aucpr, ndcg, map, pre) and for other names.
    """
    data, sep, metric = name.partition("-")
    if not sep or not metric or _HIGHER_IS_BETTER.match(metric):
        return None
    if _TRAIN_DATA.match(data):
        return ModeKeys.TRAIN
    if _VALIDATION_DATA.match(data):
        return ModeKeys.EVAL
    return None


class LossHistory:
    """The loss tensors of a run and their values, cached, for complete steps only.

    Incremental: new complete steps are appended as the run grows (each step's losses read
    once), and every query costs O(log n + what it returns), so a rule evaluated at every
    step of a long run does not re-scan the run's history (the cost per step stays flat).
    """

    def __init__(
        self,
        rule: Any,
        *,
        collection_names: Iterable[str] | None = None,
        tensor_regex: str | Sequence[str] | None = None,
        use_losses_collection: bool = True,
    ) -> None:
        self.rule = rule
        self.trial = rule.base_trial
        self.collections = list(collection_names or [])
        if use_losses_collection and "losses" not in self.collections:
            self.collections.append("losses")
        self.regexes = [tensor_regex] if isinstance(tensor_regex, str) else list(tensor_regex or [])
        # XGBoost runs have no losses, but metrics: with the default selection, use those a
        # lower value of which is better (logloss, rmse, error...), by role (train/validation).
        self._metrics_fallback = use_losses_collection and not collection_names and not tensor_regex
        self.from_metrics = False
        self._values: dict[int, dict[str, float]] = {}
        # complete global steps with some loss, ascending: all of them and per mode
        self._steps: list[int] = []
        self._modes: list[ModeKeys | None] = []
        self._by_mode: dict[ModeKeys, list[int]] = {}
        self._mode_steps: dict[ModeKeys, list[int]] = {}  # the mode step of each of _by_mode's steps
        self._mode_names: dict[ModeKeys, set[str]] = {}
        self._entry_mode_steps: list[int] = []  # the mode step of each of _steps
        self._scanned_upto = -1
        self._scanned_version: Any = None
        self._names: list[str] = []
        self._names_version: Any = None

    def names(self, step: int | None = None) -> list[str]:
        """Loss tensor names saved so far (or at global ``step``)."""
        trial = self.trial
        if step is None:
            version = _names_version(trial)
            if version is not None and version == self._names_version:
                return self._names
        names: set[str] = set()
        known = trial.collections()
        for collection in self.collections:
            if collection in known:
                names.update(trial.tensor_names(step=step, collection=collection))
        if self.regexes:
            names.update(trial.tensor_names(step=step, regex=self.regexes))
        if not names and self._metrics_fallback and "metrics" in known:
            names = {name for name in trial.tensor_names(step=step, collection="metrics") if metric_role(name)}
            self.from_metrics = self.from_metrics or bool(names)
        selected = sorted(names)
        if step is None:
            self._names, self._names_version = selected, _names_version(trial)
        return selected

    def role_names(self, role: ModeKeys) -> set[str]:
        """XGBoost metric losses of one role: TRAIN (``train-*``) or EVAL (``validation-*``...)."""
        return {name for name in self.names() if metric_role(name) == role} if self.from_metrics else set()

    def values_at(self, step: int) -> dict[str, float]:
        """{loss name: value} at global ``step`` (complete steps only; cached)."""
        cached = self._values.get(step)
        if cached is not None:
            return cached
        if not is_complete(self.trial, step):
            return {}
        names = [name for name in self.names() if saved_at(self.trial, name, step)]
        raw = read_values(self.trial, names, step) if names else {}
        values = {name: number for name, value in raw.items() if (number := scalar(value)) is not None}
        self._values[step] = values
        return values

    def _scan(self) -> None:
        """Append complete steps not looked at yet (only those after the last one scanned)."""
        trial = self.trial
        last = trial.last_complete_step
        if last is None:
            return
        version = (last, _names_version(trial))
        if version == self._scanned_version:
            return  # nothing new: rules call this on every check
        self._scanned_version = version
        if last <= self._scanned_upto:
            return
        for step in _new_steps(trial, self._scanned_upto, last):
            if is_complete(trial, step) and self.values_at(step):
                self._append(step, _mode_of(trial, step))
        self._scanned_upto = last

    def _append(self, step: int, mode: ModeKeys | None) -> None:
        mode_step = _mode_step_of(self.trial, step)
        self._steps.append(step)
        self._modes.append(mode)
        self._entry_mode_steps.append(mode_step)
        if mode is not None:
            self._by_mode.setdefault(mode, []).append(step)
            self._mode_steps.setdefault(mode, []).append(mode_step)
            self._mode_names.setdefault(mode, set()).update(self._values.get(step, {}))

    def loss_steps(self, mode: ModeKeys, upto: int | None = None, *, after: int | None = None) -> list[int]:
        """Complete global steps of ``mode`` (any mode for GLOBAL) with some loss, in
        ``(after, upto]``; O(log n + returned)."""
        self._scan()
        steps = self._steps if mode == ModeKeys.GLOBAL else self._by_mode.get(mode, [])
        low = 0 if after is None else bisect.bisect_right(steps, after)
        high = len(steps) if upto is None else bisect.bisect_right(steps, upto)
        return steps[low:high]

    def last_loss_steps(self, mode: ModeKeys, upto: int, count: int) -> list[int]:
        """The last ``count`` complete global steps of ``mode`` with some loss at or before
        ``upto``; O(log n + count)."""
        self._scan()
        steps = self._by_mode.get(mode, [])
        high = bisect.bisect_right(steps, upto)
        return steps[max(0, high - count) : high]

    def before_mode_step(self, mode: ModeKeys, mode_step: int, name: str) -> tuple[int, int] | None:
        """(mode step, global step) of the last step of ``mode`` at or before ``mode_step`` where
        loss ``name`` was saved; for GLOBAL, mode step = global step. O(log n) in general."""
        self._scan()
        if mode == ModeKeys.GLOBAL:
            steps = mode_steps = self._steps
        else:
            steps, mode_steps = self._by_mode.get(mode, []), self._mode_steps.get(mode, [])
        index = bisect.bisect_right(mode_steps, mode_step) - 1
        while index >= 0:
            if name in self._values.get(steps[index], {}):
                return mode_steps[index], steps[index]
            index -= 1
        return None

    def count(self, mode: ModeKeys) -> int:
        self._scan()
        return len(self._steps) if mode == ModeKeys.GLOBAL else len(self._by_mode.get(mode, ()))

    def modes_with_losses(self) -> set[ModeKeys]:
        self._scan()
        return set(self._by_mode)

    def entries(self, start: int = 0) -> list[tuple[int, ModeKeys | None, int]]:
        """(global step, mode, mode step) of every complete step with some loss, in order, from
        entry index ``start`` (rules keep it to read only new steps)."""
        self._scan()
        return list(zip(self._steps[start:], self._modes[start:], self._entry_mode_steps[start:], strict=True))

    def mode_names(self, mode: ModeKeys) -> set[str]:
        """Loss names saved at some step of ``mode``."""
        self._scan()
        return set(self._mode_names.get(mode, ()))

    def mean(self, steps: Iterable[int], names: set[str] | None = None) -> float | None:
        """Mean over ``steps`` of the mean of the losses in ``names`` (all when None) at each step.

        NaN when any value is NaN (never raises); None when none of the steps has those losses.
        """
        per_step = [value for step in steps if (value := self.step_mean(step, names)) is not None]
        if not per_step:
            return None
        with np.errstate(all="ignore"):
            return float(np.mean(per_step))

    def step_mean(self, step: int, names: set[str] | None = None) -> float | None:
        """The mean of the losses in ``names`` (all when None) at one step; None without any."""
        values = [value for name, value in self.values_at(step).items() if names is None or name in names]
        if not values:
            return None
        with np.errstate(all="ignore"):
            return float(sum(values) / len(values))


def _names_version(trial: Any) -> Any:
    """Changes whenever a tensor name or a collection may have been added (None: cannot tell)."""
    state = getattr(trial, "_state", None)
    if state is None or not hasattr(state, "tensors"):
        return None
    return (len(state.tensors), len(getattr(state, "reductions_of", ())), id(getattr(trial, "_collections", None)),
            len(trial.collections()))


def _new_steps(trial: Any, after: int, upto: int) -> list[int]:
    """The run's global steps in ``(after, upto]``, ascending, in O(min(upto - after, steps)):
    a live run adds a few steps at a time, and listing all of them each time is quadratic."""
    state = getattr(trial, "_state", None)
    known = getattr(state, "steps", None)
    if not isinstance(known, dict):
        return [step for step in trial.steps() if after < step <= upto]
    if upto - after <= len(known):
        return [step for step in range(after + 1, upto + 1) if step in known]
    return sorted(step for step in list(known) if after < step <= upto)


def _mode_step_of(trial: Any, step: int) -> int:
    try:
        return int(trial.mode_step(step))
    except TrialError:
        return step


def _mode_of(trial: Any, step: int) -> ModeKeys | None:
    try:
        return trial.mode(step)
    except TrialError:
        return None
