"""Overtraining: training or validation loss stopped reaching new optima.

Formula. Two series, each tracking its best value ``best`` (the first value starts it):

* training: one value per saved TRAIN loss step, the mean of the last ``smoothing`` saved TRAIN
  losses (mini-batch losses are noisy; one lucky batch would otherwise set an optimum that
  the next hundred batches cannot beat);
* validation: one value per validation pass (a block of consecutive saved EVAL steps, judged
  once a TRAIN step follows it or training ends), the mean of its losses.

A value v is a new optimum when ``v < best - delta * |best|``. The rule fires when the
validation series had no new optimum for ``patience_validation`` passes, or, in a run without
validation passes (none seen so far), when the training series had none for
``patience_train`` values. Non-finite values are skipped (ExplodingTensor reports them).

Calibrated defaults (SageMaker's parameter names):

* ``delta`` is *relative* (0.01 = 1 % of the best loss). SageMaker's is absolute (0.1 earlier
  docs, 0.01 final), which depends on the loss's scale: a converged cross-entropy of 0.05
  can never improve by 0.1, so the documented rule fires on healthy runs.
* ``patience_validation`` counts validation passes (SageMaker: steps); ``patience_train``
  counts saved TRAIN steps of the smoothed series, default 20 (documented 5).
* ``smoothing`` (trainguard only) 10.
* XGBoost runs (no ``losses``): the metrics where lower is better; ``train-*`` is the training
  series (smoothed), ``validation-*``/``eval-*``/``test-*`` the validation series with one pass
  per saved round, so ``patience_validation`` is XGBoost's ``early_stopping_rounds`` counted in
  saved rounds.
* With validation passes the training series is reported but does not fire: a training loss
  that flattens while the validation loss still improves is convergence, not overtraining
  (small healthy PyTorch runs that reach 99 % validation accuracy fire on the training series
  alone within 25 steps of converging). SageMaker fires on either series.
"""

from __future__ import annotations

import math
from collections import deque

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete
from trainguard.rules.params import Param


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


class _Optimum:
    """Best value so far and how many values since it improved."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.best_step = -1
        self.since = 0

    def add(self, value: float, step: int, delta: float) -> None:
        if self.best is None or value < self.best - delta * abs(self.best):
            self.best, self.best_step, self.since = value, step, 0
        else:
            self.since += 1


class Overtraining(Rule):
    """The loss stopped improving: training longer no longer helps (or hurts validation)."""

    rule_name = "Overtraining"
    collections = ("losses",)
    fix_hint = (
        "stop training at the best validation loss (early stopping, keep that checkpoint); if the "
        "validation loss rises while the training loss falls, add regularisation (dropout, weight decay)"
    )

    patience_train = Param(int, 20, "saved TRAIN steps without a new training optimum before firing",
                           check=_positive, documented_default=5)
    patience_validation = Param(int, 10, "validation passes without a new validation optimum before firing",
                                check=_positive, documented_default="10 (steps)")
    delta = Param(float, 0.01, "relative improvement (fraction of the best loss) that makes a new optimum",
                  check=lambda value: None if value >= 0 else "must be >= 0",
                  documented_default="0.01 absolute (earlier docs: 0.1)")
    smoothing = Param(int, 10, "TRAIN losses averaged into each training value", check=_positive)

    def validate(self) -> None:
        self._history = LossHistory(self)
        self._train = _Optimum()
        self._validation = _Optimum()
        self._recent: deque[float] = deque(maxlen=self.smoothing)
        self._train_upto = -1
        self._validated: set[int] = set()
        self._last_step = -1

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        self._last_step = max(self._last_step, step)
        return self._judge(step, final=False)

    def finish(self) -> StepResult | None:
        if not self._history.names():
            return self.missing(self._last_step, MissingTensor("scalar loss tensors", "losses"))
        return self._judge(self._last_step, final=True)

    def _judge(self, step: int, *, final: bool) -> StepResult | None:
        history = self._history
        progressed = self._add_training(step, final)
        if history.from_metrics:
            progressed = self._add_validation_metrics(step, final) or progressed
        else:
            progressed = self._add_validation_passes(step, final) or progressed
        if not progressed:
            return None
        details = {
            "best_train": self._train.best, "best_train_step": self._train.best_step,
            "train_values_since_best": self._train.since,
            "best_validation": self._validation.best, "best_validation_step": self._validation.best_step,
            "validation_passes_since_best": self._validation.since,
        }
        if self._validation.best is not None and self._validation.since >= self.patience_validation:
            return self.issue(
                step,
                f"validation loss has not improved by {fmt(100 * self.delta)} % on its best "
                f"{fmt(self._validation.best)} "
                f"(step {self._validation.best_step}) for {self._validation.since} validation passes "
                f"(patience_validation {self.patience_validation})",
                fix_hint="stop training at the best validation loss (early stopping) or lower the learning rate "
                "(a scheduler such as ReduceLROnPlateau); add regularisation if the training loss keeps falling",
                **details,
            )
        validated = self._validation.best is not None
        if not validated and self._train.best is not None and self._train.since >= self.patience_train:
            return self.issue(
                step,
                f"training loss has not improved by {fmt(100 * self.delta)} % on its best {fmt(self._train.best)} "
                f"(step {self._train.best_step}) for {self._train.since} saved steps "
                f"(patience_train {self.patience_train})",
                fix_hint="training has converged: stop early, or decay the learning rate "
                "(torch.optim.lr_scheduler) if the loss is still too high",
                **details,
            )
        return self.no_issue(step, **details)

    def _add_training(self, step: int, final: bool) -> bool:
        history = self._history
        names = history.role_names(ModeKeys.TRAIN) or None  # XGBoost: the train-* metrics
        progressed = False
        for train_step in history.loss_steps(ModeKeys.TRAIN, upto=None if final else step):
            if train_step <= self._train_upto:
                continue
            self._train_upto = train_step
            value = history.mean([train_step], names)
            if value is None or not math.isfinite(value):
                continue
            self._recent.append(value)
            self._train.add(sum(self._recent) / len(self._recent), train_step, self.delta)
            progressed = True
        return progressed

    def _add_validation_passes(self, step: int, final: bool) -> bool:
        history = self._history
        progressed = False
        blocks = history.blocks(upto=None if final else step)
        for index, block in enumerate(blocks):
            if block.mode != ModeKeys.EVAL or block.first in self._validated:
                continue
            if index + 1 == len(blocks) and not final:
                continue  # the validation pass may still be running
            self._validated.add(block.first)
            value = history.mean(block.steps)
            if value is None or not math.isfinite(value):
                continue
            self._validation.add(value, block.last, self.delta)
            progressed = True
        return progressed

    def _add_validation_metrics(self, step: int, final: bool) -> bool:
        """XGBoost: every saved round evaluated the validation data: one pass per saved round."""
        history = self._history
        names = history.role_names(ModeKeys.EVAL)
        if not names:
            return False
        progressed = False
        for saved in history.loss_steps(ModeKeys.GLOBAL, upto=None if final else step):
            if saved in self._validated:
                continue
            self._validated.add(saved)
            value = history.mean([saved], names)
            if value is None or not math.isfinite(value):
                continue
            self._validation.add(value, saved, self.delta)
            progressed = True
        return progressed
