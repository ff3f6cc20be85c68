"""Overtraining: the validation loss rose above its best and stayed there: training longer hurts.

Calibrated semantics (the default). One value per validation pass (consecutive saved EVAL steps,
judged once a later step says the pass is finished, or training ends: the mean of its losses; in
XGBoost runs the ``validation-*``/``eval-*``/``test-*`` metrics where lower is better, one pass per
saved round). Passes are compared only when they hold the same batches (each saved whole, or the
same first ``n`` batches of each, as trainguard's hook saves them): one batch of each pass (every
10th EVAL step of 8-batch passes) is never compared with another, and a run whose validation
passes are none of them comparable ends "not evaluated", saying why (``_eval_passes``). With \
``noise`` the pass-to-pass spread of the validation loss (1.4826 x median
|second difference| / sqrt 6 over the last 64 passes: a steady trend is not noise):

    fire when the best pass is at least patience_validation passes old and every one of the
    last patience_validation passes is above best + max(delta * |best|, 4 * noise)

(the lowest of a few dozen noisy passes lies about 2 noise below the loss's level: 4 noise
above it is 2 above that level, which each pass reaches by chance with odds of about 1 in 40).

A validation loss that only flattens is convergence, and a flat training loss alone is
convergence too: neither fires. The finding is certain (it is confirmed by every pass of its
window): stopping then is early stopping, too late by patience_validation passes. A run without
validation losses ends "not evaluated" (in such a run the rule has nothing to judge).

SageMaker semantics (``semantics="sagemaker"``): trainguard's earlier per-optimum formula below.

Formula. Two series, each tracking its best value ``best`` (the first value starts it):

* training: one value per saved TRAIN loss step, the mean of the last ``smoothing`` saved TRAIN
  losses (mini-batch losses are noisy; one lucky batch would otherwise set an optimum that
  the next hundred batches cannot beat);
* validation: one value per comparable validation pass (as above), the mean of its losses.

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
from typing import Any

from trainguard.modes import ModeKeys
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._eval_passes import ValidationPasses
from trainguard.rules.builtin._loss_stats import BestTracker
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete
from trainguard.rules.params import SAGEMAKER, Param, semantics_param


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
    fix_hints = {
        "pytorch": "stop at the best validation loss (early stopping: keep that epoch's state_dict); add "
        "regularisation (dropout, weight_decay= in the optimizer) or more training data",
        "keras": "stop at the best validation loss: keras.callbacks.EarlyStopping(monitor='val_loss', "
        "restore_best_weights=True); add regularisation (Dropout layers, kernel_regularizer)",
        "xgboost": "stop at the best validation round: pass early_stopping_rounds= with an evaluation set; "
        "lower eta, max_depth, or raise min_child_weight / subsample < 1",
    }
    stop_policy = (
        "stops training when the validation loss stayed above its best (beyond its pass-to-pass noise) "
        "for every one of patience_validation passes: early stopping"
    )

    patience_train = Param(int, 20, "saved TRAIN steps without a new training optimum before firing",
                           check=_positive, documented_default=5)
    patience_validation = Param(int, 10, "validation passes without a new validation optimum before firing",
                                check=_positive, documented_default="10 (steps)")
    delta = Param(float, 0.01, "relative improvement (fraction of the best loss) that makes a new optimum",
                  check=lambda value: None if value >= 0 else "must be >= 0",
                  documented_default="0.01 absolute (earlier docs: 0.1)")
    smoothing = Param(int, 10, "TRAIN losses averaged into each training value (SageMaker semantics)",
                      check=_positive)
    semantics = semantics_param()

    def validate(self) -> None:
        self._history = LossHistory(self)
        self._train = _Optimum()
        self._validation = _Optimum()
        self._recent: deque[float] = deque(maxlen=self.smoothing)
        self._train_upto = -1
        self._last_step = -1
        self._eval_passes = ValidationPasses(self._history)
        self._rounds_upto = -1  # XGBoost: last saved round judged
        self._passes = BestTracker()
        self._judged_any = False

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        self._last_step = max(self._last_step, step)
        return self._judge(step, final=False)

    def finish(self) -> StepResult | None:
        if not self._history.names():
            return self.not_evaluated("no scalar loss tensors were saved (save the 'losses' collection)",
                                      self._last_step)
        result = self._judge(self._last_step, final=True)
        if result is None and not self._judged_any:
            if self.semantics == SAGEMAKER:
                return self.not_evaluated("no saved loss to judge", self._last_step)
            if self._eval_passes.seen_any():
                return self.not_evaluated(self._eval_passes.reason(), self._last_step)
            # no validation pass at all: the run's design (Overfit says the same, see there)
            return self.not_applicable(
                "no validation losses: Overtraining judges the validation loss (run validation under "
                "hook.set_mode(modes.EVAL), or give XGBoost an evaluation set); a flat training loss alone is "
                "convergence", self._last_step)
        return result

    def _judge(self, step: int, *, final: bool) -> StepResult | None:
        if self.semantics != SAGEMAKER:
            return self._judge_calibrated(step, final=final)
        history = self._history
        progressed = self._add_training(step, final)
        if history.from_metrics:
            progressed = self._add_validation_metrics(step, final) or progressed
        else:
            progressed = self._add_validation_passes(step, final) or progressed
        if not progressed:
            return None
        details: dict[str, Any] = {
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

    def _judge_calibrated(self, step: int, *, final: bool) -> StepResult | None:
        history = self._history
        if history.from_metrics:
            progressed = self._add_validation_metrics(step, final, self._passes)
        else:
            progressed = self._add_validation_passes(step, final, self._passes)
        if not progressed:
            return None
        self._judged_any = True
        passes = self._passes
        facts = passes.risen(self.patience_validation, self.delta)
        details: dict[str, Any] = {
            "best_validation": passes.best,
            "best_validation_step": passes.steps[passes.best_index],
            "validation_passes_since_best": passes.since_best,
            "validation_loss": passes.values[-1],
        }
        step = max(step, passes.steps[-1])
        if facts is None:
            return self.no_issue(step, **details)
        rises: dict[str, Any] = {f"rise_{key}": value for key, value in facts.items()}
        return self.issue(
            step,
            f"validation loss {fmt(facts['latest'])} has stayed above its best {fmt(facts['best'])} (step "
            f"{facts['best_step']}) for {facts['since_best']} passes; each of the last {self.patience_validation} is "
            f"above it by more than {fmt(facts['margin'])} (4 x its pass-to-pass noise {fmt(facts['noise'])}, at "
            f"least delta {fmt(100 * self.delta)} %)",
            certain=True,
            **details,
            **rises,
        )

    def _add_training(self, step: int, final: bool) -> bool:
        history = self._history
        names = history.role_names(ModeKeys.TRAIN) or None  # XGBoost: the train-* metrics
        progressed = False
        for train_step in history.loss_steps(ModeKeys.TRAIN, upto=None if final else step, after=self._train_upto):
            self._train_upto = train_step
            value = history.mean([train_step], names)
            if value is None or not math.isfinite(value):
                continue
            self._recent.append(value)
            self._train.add(sum(self._recent) / len(self._recent), train_step, self.delta)
            progressed = True
        return progressed

    def _add_validation_passes(self, step: int, final: bool, tracker: BestTracker | None = None) -> bool:
        history = self._history
        progressed = False
        for validation_pass in self._eval_passes.new(None if final else step, final=final):
            if not validation_pass.kind:
                continue  # not comparable (EvalPass.why_not; said when no pass was)
            value = history.mean(validation_pass.compared)
            if value is None or not math.isfinite(value):
                continue
            if tracker is not None:
                tracker.add(value, validation_pass.last)
            else:
                self._validation.add(value, validation_pass.last, self.delta)
            progressed = True
        return progressed

    def _add_validation_metrics(self, step: int, final: bool, tracker: BestTracker | None = None) -> bool:
        """XGBoost: every saved round evaluated the validation data: one pass per saved round."""
        history = self._history
        names = history.role_names(ModeKeys.EVAL)
        if not names:
            return False
        progressed = False
        for saved in history.loss_steps(ModeKeys.GLOBAL, upto=None if final else step, after=self._rounds_upto):
            self._rounds_upto = saved
            value = history.step_mean(saved, names)
            if value is None or not math.isfinite(value):
                continue
            if tracker is not None:
                tracker.add(value, saved)
            else:
                self._validation.add(value, saved, self.delta)
            progressed = True
        return progressed
