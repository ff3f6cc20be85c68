"""Overfit: the validation loss rose while the training loss kept falling, and the gap is wide.

Saved EVAL loss steps form validation *passes* (consecutive EVAL steps: no step of another mode
between). Passes are compared only when they hold the same batches: each saved whole, or each
the same first ``n`` batches (trainguard's hook saves the losses of the first 64 steps of every
pass); one batch of each pass (every 10th EVAL step of 8-batch passes is a different batch each
time) is never compared with another, and a run with validation passes none of which is
comparable ends "not evaluated", saying why (``_eval_passes`` has the definitions). For each
comparable pass P starting at or after ``start_step``:

    L_eval  = mean loss over the compared steps of P
    L_train = mean of the last ``train_window`` TRAIN losses saved before P
    r       = (L_eval - L_train) / |L_train|

Only loss tensors saved in both modes are compared (their per-step mean). A pass is judged when
a later step tells it is finished (the next TRAIN step, or the next pass), or at the end of
training (``finish``). Passes with a non-finite training loss are skipped; a zero training loss
(a memorised training set) is an unbounded gap under calibrated semantics, skipped under
SageMaker's.

Calibrated semantics (the default). A gap alone is not overfitting: a healthy model's validation
loss is commonly 10-50 % above its training loss (a small validation set, dropout off in EVAL)
and stays there. Overfitting is the gap *widening*: the validation loss rises while the training
loss still falls. With ``noise`` the pass-to-pass spread of the validation loss (1.4826 x median
|second difference| / sqrt 6: a steady trend is not noise):

    fire when  the best validation pass is at least ``patience`` passes old,
               every one of the last ``patience`` passes is above best + max(1 % of best, 4 * noise),
               L_train now is below L_train at the best pass (training still improves; a training
               loss that was and is exactly 0, a memorised training set, counts too), and
               r > ratio_threshold

The finding is certain (confirmed by every pass of its window).

SageMaker semantics (``semantics="sagemaker"``): fire when r > ratio_threshold for ``patience``
consecutive validation passes (SageMaker's condition with its documented defaults patience 1 and
ratio_threshold 0.1 when given; trainguard's defaults 3 and 0.25 otherwise).

Cost: each pass is judged once from running state (the last ``train_window`` training steps and
the passes' values); the cost per step does not grow with the run.
"""

from __future__ import annotations

import math

from trainguard.modes import ModeKeys
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._eval_passes import EvalPass, ValidationPasses
from trainguard.rules.builtin._loss_stats import BestTracker
from trainguard.rules.builtin._losses import LossHistory, fmt, is_complete
from trainguard.rules.params import SAGEMAKER, Param, semantics_param


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


class Overfit(Rule):
    """Validation loss rising above its best while the training loss keeps falling (the gap widens)."""

    rule_name = "Overfit"
    collections = ("losses",)
    fix_hint = (
        "add regularisation: dropout, weight decay, data augmentation, or stop early at the best validation "
        "loss; or use a smaller model / more training data"
    )
    fix_hints = {
        "pytorch": "add regularisation: nn.Dropout, weight decay (optimizer weight_decay=...), data augmentation, "
        "or stop early at the best validation loss (keep that state_dict); or a smaller model / more data",
        "keras": "add regularisation: Dropout layers, kernel_regularizer=keras.regularizers.L2(...), data "
        "augmentation, or keras.callbacks.EarlyStopping(monitor='val_loss', restore_best_weights=True)",
        "xgboost": "regularise the trees: lower max_depth and eta, raise min_child_weight, gamma or reg_lambda, "
        "subsample/colsample_bytree < 1, and pass early_stopping_rounds= with an evaluation set",
    }
    stop_policy = (
        "stops training when the validation loss stayed above its best, beyond its noise, for every one of "
        "patience passes while the training loss kept falling (SageMaker semantics: never)"
    )

    tensor_regex = Param(list, None, "regexes of the loss tensors (default: the 'losses' collection)", optional=True)
    start_step = Param(int, 0, "ignore validation passes that start before this global step",
                       check=lambda value: None if value >= 0 else "must be >= 0")
    patience = Param(int, 3, "validation passes the condition must hold for",
                     check=_positive, documented_default=1)
    ratio_threshold = Param(float, 0.25, "the gap (val - train) / train must exceed this",
                            documented_default=0.1)
    train_window = Param(int, 10, "training losses (the last saved before a validation pass) averaged as L_train",
                         check=_positive)
    semantics = semantics_param()

    def validate(self) -> None:
        self._history = LossHistory(self, tensor_regex=self.tensor_regex, use_losses_collection=True)
        self._streak = 0
        self._last_step = -1
        self._passes = ValidationPasses(self._history)
        self._compared = 0  # passes compared (judged with a training loss before them)
        self._comparable_seen = False
        self._validation = BestTracker()
        self._train_at_pass: list[float] = []  # L_train at each pass the tracker holds

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        self._last_step = max(self._last_step, step)
        return self._judge(step, include_open_block=False)

    def finish(self) -> StepResult | None:
        history = self._history
        if not history.names():
            return self.not_evaluated("no scalar loss tensors were saved (save the 'losses' collection)",
                                      self._last_step)
        if history.from_metrics:  # by the run's design: not applicable (Rule.not_applicable)
            return self.not_applicable(
                "an XGBoost run: use Overtraining, which watches the validation metrics (boosting always drives "
                "the training loss far below it)", self._last_step)
        result = self._judge(self._last_step, include_open_block=True)
        modes = history.modes_with_losses()
        if ModeKeys.TRAIN in modes and ModeKeys.EVAL not in modes:
            # a loop without validation (zero-code capture files model.eval()/no_grad passes as
            # EVAL): the run has nothing to compare, by its design. A validation loop the Hook API
            # saved as TRAIN (no hook.set_mode) reads the same; the reason says how to mark it.
            return self.not_applicable(
                "the run has no validation pass (no losses of EVAL steps; run validation under "
                "hook.set_mode(modes.EVAL))", self._last_step)
        if ModeKeys.EVAL not in modes or ModeKeys.TRAIN not in modes:
            return self.not_evaluated(
                "needs losses of both TRAIN and EVAL steps (run validation under hook.set_mode(modes.EVAL))",
                self._last_step)
        if result is None and not self._validation.values and not self._compared:
            if self._passes.seen_any() and not self._comparable_seen:
                return self.not_evaluated(self._passes.reason(), self._last_step)
            return self.not_evaluated("no validation pass had a training loss before it to compare with",
                                      self._last_step)
        return result

    def _judge(self, step: int, *, include_open_block: bool) -> StepResult | None:
        history = self._history
        passes = self._passes.new(None if include_open_block else step, final=include_open_block)
        if not passes:
            return None
        common = history.mode_names(ModeKeys.TRAIN) & history.mode_names(ModeKeys.EVAL)
        judged: list[dict[str, float | int]] = []
        fired: dict[str, float | int] | None = None
        for validation_pass in passes:
            if not validation_pass.kind:
                continue  # not comparable (why: EvalPass.why_not; said when no pass was)
            self._comparable_seen = True
            if validation_pass.first < self.start_step or not common:
                continue
            facts = self._ratio(validation_pass, common)
            if facts is None:
                continue
            self._compared += 1
            facts = self._judge_pass(facts)
            judged.append(facts)
            if facts["fired"]:
                fired = facts
        if not judged:
            return None
        step = max(step, int(judged[-1]["eval_last_step"]))
        if fired is not None:
            if self.semantics == SAGEMAKER:
                message = (
                    f"validation loss {fmt(fired['eval_loss'])} is {fmt(100 * fired['ratio'])} % above the training "
                    f"loss {fmt(fired['train_loss'])} (ratio_threshold {fmt(self.ratio_threshold)}) for "
                    f"{self._streak} consecutive validation pass(es) (patience {self.patience})"
                )
            else:
                message = (
                    f"validation loss rose to {fmt(fired['eval_loss'])} from its best {fmt(fired['best'])} (step "
                    f"{fired['best_step']}) and stayed above it by more than {fmt(fired['margin'])} (4 x its "
                    f"pass-to-pass noise) for {self.patience} passes, while the training loss fell to "
                    f"{fmt(fired['train_loss'])}: the gap is {fmt(100 * fired['ratio'])} % (ratio_threshold "
                    f"{fmt(self.ratio_threshold)})"
                )
            return self.issue(step, message, certain=self.semantics != SAGEMAKER, passes=judged)
        return self.no_issue(step, passes=judged)

    def _judge_pass(self, facts: dict[str, float | int]) -> dict[str, float | int]:
        if self.semantics == SAGEMAKER:
            self._streak = self._streak + 1 if facts["ratio"] > self.ratio_threshold else 0
            facts["streak"] = self._streak
            facts["fired"] = self._streak >= self.patience
            return facts
        tracker = self._validation
        tracker.add(float(facts["eval_loss"]), int(facts["eval_last_step"]))
        self._train_at_pass.append(float(facts["train_loss"]))
        risen = tracker.risen(self.patience, 0.01)
        train_at_best = self._train_at_pass[tracker.best_index]
        # a memorised training set's loss underflows to exactly 0 and cannot fall further: it counts as
        # still improving (else a model that memorised its data before the best pass could never overfit)
        still_improving = facts["train_loss"] < train_at_best or facts["train_loss"] == train_at_best == 0
        facts["fired"] = bool(risen is not None and still_improving and facts["ratio"] > self.ratio_threshold)
        if risen is not None:
            facts.update(risen)
        return facts

    def _ratio(self, validation_pass: EvalPass, names: set[str]) -> dict[str, float | int] | None:
        history = self._history
        train_steps = history.last_loss_steps(ModeKeys.TRAIN, validation_pass.first, self.train_window)
        train = history.mean(train_steps, names)
        evaluation = history.mean(validation_pass.compared, names)
        if train is None or evaluation is None or not math.isfinite(train) or not math.isfinite(evaluation):
            return None
        if train == 0:
            if self.semantics == SAGEMAKER or evaluation <= 0:
                return None
            ratio = math.inf  # a memorised training set (CrossEntropy underflows to 0): the gap is unbounded
        else:
            ratio = (evaluation - train) / abs(train)
        return {"eval_first_step": validation_pass.first, "eval_last_step": validation_pass.last,
                "eval_steps": len(validation_pass.compared), "eval_loss": evaluation, "train_loss": train,
                "ratio": ratio}
