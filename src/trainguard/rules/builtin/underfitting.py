"""Underfitting: the training loss never got meaningfully below where it started: the model did not learn.

Not a SageMaker rule (trainguard's own). Losses: the training mini-batch losses (mode TRAIN;
GLOBAL when the run has no TRAIN steps). XGBoost runs: the ``train-*`` metrics where lower is
better (``train-logloss``), one step per round; ``warmup_steps`` then counts rounds.

Calibrated semantics (the default): a verdict on the whole run, given when training ended
(``finish``). A model may sit on a plateau for hundreds of steps before it learns (an XOR net
stays at ln 2, then drops to 1e-3): a plateau that training later leaves is not underfitting,
and only the end of the run tells. With F the first ``window`` saved finite losses and R the
last ``window``:

    reference = baseline if given else mean(F)
    d         = (reference - mean(R)) / |reference|            (relative decrease)
    bound     = d + 2.58 * (Welch standard error of that difference) / |reference|
    fire if bound < min_improvement                         (needs 2 x window losses and
                                                             the last mode step >= warmup_steps)

i.e. the loss surely fell by less than ``min_improvement`` (99.5 % confidence): a run whose
losses are too noisy to tell is not called underfitting, a converged run is far below its
start. ``baseline`` is a trivial model's loss, e.g. ``ln(num_classes)`` for cross-entropy or the
target's variance for mean squared error. Catches a learning rate far too small, a frozen model
(optimizer given the wrong parameters), labels shuffled independently of their inputs.

SageMaker semantics (``semantics="sagemaker"``; trainguard's earlier per-step formula), on
the saved loss values up to the evaluated step s (``n`` of them, finite only):

    w = min(window, n // 2)  (needs n >= 2);  start = mean of the first w;  current = mean of the last w
    reference = baseline if given else start
    evaluated at steps whose mode step >= warmup_steps
    fire if current > reference - min_improvement * |reference|

Cost: each saved loss is read once; the state is the first window and the last one.
"""

from __future__ import annotations

import math
from collections import deque

from trainguard.modes import ModeKeys
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._loss_stats import Z_99, decrease_upper_bound, mean, variance
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete
from trainguard.rules.params import SAGEMAKER, Param, semantics_param

_HINT = (
    "the model is not learning: raise the learning rate (or warm it up), check that the optimizer receives the "
    "model's parameters, that labels match their inputs and that the loss gets raw logits; normalise the "
    "inputs; try a larger model"
)


class Underfitting(Rule):
    """The training loss stays at its starting (or a trivial baseline's) level: the model is not learning."""

    rule_name = "Underfitting"
    collections = ("losses",)
    fix_hint = _HINT
    fix_hints = {
        "pytorch": "the model is not learning: raise the learning rate (or warm it up), check that the optimizer "
        "receives model.parameters() and that optimizer.step() runs, that labels match their inputs and that "
        "CrossEntropyLoss gets raw logits (no softmax before it); normalise the inputs; try a larger model",
        "keras": "the model is not learning: raise the optimizer's learning_rate, check that the layers are "
        "trainable, that labels match their inputs and that from_logits matches the last layer; normalise the "
        "inputs (a Normalization layer); try a larger model",
        "xgboost": "the model is not learning: raise eta (learning_rate), max_depth or num_boost_round, lower "
        "min_child_weight / gamma / reg_lambda, and check that labels match their rows",
    }
    stop_policy = "never stops training: a verdict on the whole run, reported when training ended"

    tensor_regex = Param(list, None, "regexes of the loss tensors (default: the 'losses' collection)", optional=True)
    warmup_steps = Param(int, 100, "TRAIN steps before the loss is judged",
                         check=lambda value: None if value >= 0 else "must be >= 0")
    min_improvement = Param(float, 0.1, "fraction of the reference loss the loss must fall by",
                            check=lambda value: None if 0 <= value < 1 else "must be in [0, 1)")
    baseline = Param(float, None, "a trivial model's loss to beat (e.g. ln(num_classes) for cross-entropy)",
                     optional=True)
    window = Param(int, 8, "saved losses averaged at the start and at the end (SageMaker semantics: at the "
                   "current step)", check=lambda value: None if value > 0 else "must be > 0")
    semantics = semantics_param()

    def validate(self) -> None:
        self._history = LossHistory(self, tensor_regex=self.tensor_regex, use_losses_collection=True)
        self._last_step = -1
        self._first: list[float] = []
        self._recent: deque[float] = deque(maxlen=self.window)
        self._count = 0
        self._mode: ModeKeys | None = None
        self._consumed = -1
        self._last_mode_step = -1
        self._judged = False

    def _consume(self, step: int | None) -> ModeKeys:
        history = self._history
        mode = ModeKeys.TRAIN if ModeKeys.TRAIN in history.modes_with_losses() else ModeKeys.GLOBAL
        if mode != self._mode:  # the first TRAIN step arrived: start over on TRAIN steps
            self._mode, self._first, self._count, self._consumed = mode, [], 0, -1
            self._recent.clear()
        names = history.role_names(ModeKeys.TRAIN) or None  # XGBoost: the train-* metrics
        for saved in history.loss_steps(mode, upto=step, after=self._consumed):
            self._consumed = saved
            self._last_mode_step = saved if mode == ModeKeys.GLOBAL else self.base_trial.mode_step(saved)
            value = history.step_mean(saved, names)
            if value is None or not math.isfinite(value):
                continue
            self._count += 1
            if len(self._first) < self.window:
                self._first.append(value)
            self._recent.append(value)
        return mode

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        self._last_step = max(self._last_step, step)
        if not self._history.names():
            return None
        mode = self._consume(step)
        if self.semantics != SAGEMAKER:
            return None  # judged on the whole run in finish()
        if step != self._consumed:
            return None
        mode_step = self._last_mode_step
        if mode_step < self.warmup_steps or self._count < 2:
            return None
        self._judged = True
        width = min(self.window, self._count // 2)
        start = sum(self._first[:width]) / width
        current = sum(list(self._recent)[-width:]) / width
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

    def finish(self) -> StepResult | None:
        if not self._history.names():
            return self.not_evaluated("no scalar loss tensors were saved (save the 'losses' collection)",
                                      self._last_step)
        mode = self._consume(None)
        if self.semantics == SAGEMAKER:
            if not self._judged:
                return self.not_evaluated(f"no saved training loss at or after warmup_steps={self.warmup_steps}",
                                          self._last_step)
            return None
        step = max(self._last_step, self._consumed)
        if self._count < 2 * self.window:
            return self.not_evaluated(f"{self._count} finite saved training loss(es); the rule needs 2 x window = "
                                      f"{2 * self.window}", step)
        if self._last_mode_step < self.warmup_steps:
            return self.not_evaluated(f"training ended at step {self._last_mode_step}, before warmup_steps="
                                      f"{self.warmup_steps}", step)
        current = list(self._recent)
        if self.baseline is not None:
            scale = abs(self.baseline) or 1.0
            decrease = (self.baseline - mean(current)) / scale
            upper = decrease + Z_99 * math.sqrt(variance(current) / len(current)) / scale
            reference, against = self.baseline, f"the baseline {fmt(self.baseline)}"
        else:
            decrease, upper = decrease_upper_bound(self._first, current)
            reference = mean(self._first)
            against = f"its start {fmt(reference)} (mean of the first {len(self._first)})"
        details = {"start": mean(self._first), "current": mean(current), "reference": reference,
                   "decrease": decrease, "decrease_upper_bound": upper, "mode": mode.name}
        if upper < self.min_improvement:
            return self.issue(
                step,
                f"after {self._last_mode_step} steps the training loss {fmt(mean(current))} (mean of the last "
                f"{len(current)} saved) is {fmt(100 * decrease)} % below {against}: surely less than "
                f"min_improvement {fmt(100 * self.min_improvement)} % (99.5 % bound {fmt(100 * upper)} %)",
                **details,
            )
        return self.no_issue(step, **details)
