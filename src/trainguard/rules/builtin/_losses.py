"""Shared pieces of the loss rules (LossNotDecreasing, Overfit, Underfitting, Overtraining).

Losses are scalar tensors: collection ``losses`` in PyTorch runs (``CrossEntropyLoss_output_0``,
``loss_backward_output_0``...), ``metrics`` in XGBoost runs (``train-rmse``). A saved loss that
is not a single number (``reduction='none'``) counts as its mean. Values are read once and
cached: a live rule evaluates every step and looks back at earlier ones.

Evaluation "blocks": a validation pass saves a run of consecutive EVAL steps between TRAIN
steps. Overfit and Overtraining compare per *block* (one value per validation pass, the mean
of its losses), so their patience counts validation passes, not batches.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.errors import TrialError
from trainguard.modes import ModeKeys

# one implementation for every rule: re-exported for the loss/classification/XGBoost rules
from trainguard.rules.builtin._helpers import is_complete, read_values

__all__ = ["Block", "LossHistory", "fmt", "is_complete", "metric_role", "parse_mode", "read_values"]


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


@dataclass(frozen=True)
class Block:
    """A run of consecutive saved steps of one mode (a validation pass, or the training between)."""

    mode: ModeKeys
    steps: tuple[int, ...]  # global steps, ascending

    @property
    def first(self) -> int:
        return self.steps[0]

    @property
    def last(self) -> int:
        return self.steps[-1]


class LossHistory:
    """The loss tensors of a run and their values, cached, for complete steps only."""

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
        self._loss_steps: list[tuple[int, ModeKeys | None]] = []
        self._scanned_upto = -1

    def names(self, step: int | None = None) -> list[str]:
        """Loss tensor names saved so far (or at global ``step``)."""
        trial = self.trial
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
        return sorted(names)

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
        raw = read_values(self.trial, self.names(), step)
        values = {name: number for name, value in raw.items() if (number := scalar(value)) is not None}
        self._values[step] = values
        return values

    def _scan(self) -> None:
        """Extend the list of loss steps with complete steps not looked at yet (incremental)."""
        last = getattr(self.trial, "last_complete_step", None)
        if isinstance(last, int) and last <= self._scanned_upto:
            return  # nothing new: skip listing every step (rules call this on every check)
        steps = self.trial.steps()
        start = bisect.bisect_right(steps, self._scanned_upto)
        for step in steps[start:]:
            if self.values_at(step):
                self._loss_steps.append((step, _mode_of(self.trial, step)))
        if steps:
            self._scanned_upto = max(self._scanned_upto, steps[-1])

    def loss_steps(self, mode: ModeKeys, upto: int | None = None) -> list[int]:
        """Complete global steps of ``mode`` (any mode for GLOBAL) at which some loss was saved."""
        self._scan()
        return [
            step
            for step, step_mode in self._loss_steps
            if (upto is None or step <= upto) and (mode == ModeKeys.GLOBAL or step_mode == mode)
        ]

    def modes_with_losses(self) -> set[ModeKeys]:
        self._scan()
        return {mode for _, mode in self._loss_steps if mode is not None}

    def blocks(self, upto: int | None = None) -> list[Block]:
        """TRAIN and EVAL blocks of saved loss steps up to global ``upto`` (PREDICT is ignored)."""
        self._scan()
        blocks: list[Block] = []
        current: list[int] = []
        current_mode: ModeKeys | None = None
        for step, mode in self._loss_steps:
            if upto is not None and step > upto:
                break
            if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
                continue
            if mode != current_mode and current:
                blocks.append(Block(current_mode, tuple(current)))  # type: ignore[arg-type]
                current = []
            current_mode = mode
            current.append(step)
        if current:
            blocks.append(Block(current_mode, tuple(current)))  # type: ignore[arg-type]
        return blocks

    def mode_names(self, mode: ModeKeys) -> set[str]:
        """Loss names saved at some step of ``mode``."""
        self._scan()
        steps = [step for step, step_mode in self._loss_steps if step_mode == mode]
        return {name for step in steps for name in self._values.get(step, {})}

    def mean(self, steps: Iterable[int], names: set[str] | None = None) -> float | None:
        """Mean over ``steps`` of the mean of the losses in ``names`` (all when None) at each step.

        NaN when any value is NaN (never raises); None when none of the steps has those losses.
        """
        per_step = []
        for step in steps:
            values = [value for name, value in self.values_at(step).items() if names is None or name in names]
            if values:
                per_step.append(sum(values) / len(values))
        if not per_step:
            return None
        with np.errstate(all="ignore"):
            return float(np.mean(per_step))


def _mode_of(trial: Any, step: int) -> ModeKeys | None:
    try:
        return trial.mode(step)
    except TrialError:
        return None
