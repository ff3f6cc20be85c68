"""Underfitting: after a warm-up, the training loss is not meaningfully below where it started.

Not a SageMaker rule (trainguard's own). Formula, on the saved loss values of ``mode`` (finite
values only, in step order, ``n`` of them up to the evaluated step s):

    w         = min(window, n // 2)                    (needs n >= 2)
    start     = mean of the first w values
    current   = mean of the last w values
    reference = baseline if given else start
    evaluated when the mode step of s >= warmup_steps
    fire if current > reference - min_improvement * |reference|

``baseline`` is a trivial model's loss, e.g. ``ln(num_classes)`` for cross-entropy (the loss
of predicting uniform probabilities) or the target's variance for mean squared error: a
model that does not beat it has learnt nothing from its inputs. Without it the rule compares
with the loss the model started from, which catches a learning rate far too small, a frozen
model (optimizer given the wrong parameters), labels shuffled independently of their inputs,
and a loss that diverged upwards. Mode: TRAIN (GLOBAL when the run has no TRAIN steps).
XGBoost runs: the ``train-*`` metrics where lower is better (``train-logloss``), one step per
round; ``warmup_steps`` then counts rounds.
"""

from __future__ import annotations

import math

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete
from trainguard.rules.params import Param


class Underfitting(Rule):
    """The training loss stays at its starting (or a trivial baseline's) level: the model is not learning."""

    rule_name = "Underfitting"
    collections = ("losses",)
    fix_hint = (
        "the model is not learning: raise the learning rate (or warm it up), check that the optimizer "
        "receives model.parameters(), that labels match their inputs and that CrossEntropyLoss gets raw "
        "logits (no softmax before it); normalise the inputs; try a larger model"
    )

    tensor_regex = Param(list, None, "regexes of the loss tensors (default: the 'losses' collection)", optional=True)
    warmup_steps = Param(int, 100, "TRAIN steps before the loss is judged",
                         check=lambda value: None if value >= 0 else "must be >= 0")
    min_improvement = Param(float, 0.1, "fraction of the reference loss the loss must fall by",
                            check=lambda value: None if 0 <= value < 1 else "must be in [0, 1)")
    baseline = Param(float, None, "a trivial model's loss to beat (e.g. ln(num_classes) for cross-entropy)",
                     optional=True)
    window = Param(int, 5, "saved losses averaged at the start and at the current step",
                   check=lambda value: None if value > 0 else "must be > 0")

    def validate(self) -> None:
        self._history = LossHistory(self, tensor_regex=self.tensor_regex, use_losses_collection=True)
        self._last_step = -1

    def finish(self) -> StepResult | None:
        if not self._history.names():
            return self.missing(self._last_step, MissingTensor("scalar loss tensors", "losses"))
        return None

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        self._last_step = max(self._last_step, step)
        history = self._history
        values_now = history.values_at(step)
        if not values_now:
            return None
        mode = ModeKeys.TRAIN if ModeKeys.TRAIN in history.modes_with_losses() else ModeKeys.GLOBAL
        if mode != ModeKeys.GLOBAL and trial.mode(step) != mode:
            return None
        mode_step = step if mode == ModeKeys.GLOBAL else trial.mode_step(step)
        if mode_step < self.warmup_steps:
            return None
        names = history.role_names(ModeKeys.TRAIN) or None  # XGBoost: the train-* metrics
        series = [
            value
            for saved in history.loss_steps(mode, upto=step)
            if (value := history.mean([saved], names)) is not None and math.isfinite(value)
        ]
        if len(series) < 2:
            return None
        width = min(self.window, len(series) // 2)
        start = sum(series[:width]) / width
        current = sum(series[-width:]) / width
        reference = self.baseline if self.baseline is not None else start
        limit = reference - self.min_improvement * abs(reference)
        details = {"start": start, "current": current, "reference": reference, "limit": limit, "mode": mode.name}
        if current > limit:
            against = f"baseline {fmt(reference)}" if self.baseline is not None else f"its starting value {fmt(start)}"
            return self.issue(
                step,
                f"after {mode_step} steps the loss {fmt(current)} is not {fmt(100 * self.min_improvement)} % below "
                f"{against} (must be <= {fmt(limit)})",
                **details,
            )
        return self.no_issue(step, **details)
