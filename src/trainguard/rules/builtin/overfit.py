"""Overfit: the validation loss stays well above the training loss.

Formula. Saved loss steps form alternating TRAIN and EVAL *blocks* (an EVAL block is one
validation pass). For each finished EVAL block B starting at or after ``start_step``:

    L_eval  = mean loss over the steps of B
    L_train = mean of the last ``train_window`` TRAIN losses saved before B
    r       = (L_eval - L_train) / |L_train|
    fire when r > ratio_threshold for ``patience`` consecutive validation passes

Only loss tensors saved in both modes are compared (their per-step mean). An EVAL block is
finished when a TRAIN step follows it, or at the end of training (``finish``). Passes with a
non-finite or zero training loss are skipped without resetting the count.

Calibrated defaults (SageMaker's parameter names):

* ``patience`` 3 validation passes (documented 1 step): a single pass 10-25 % above the
  training loss is normal (a small validation set, dropout off in EVAL, a learning-rate step).
* ``ratio_threshold`` 0.25 (documented 0.1): a healthy model's validation loss is commonly
  10-20 % above its training loss; overfitting shows as a gap that keeps widening past that.
* ``train_window`` (trainguard only) 10: the mean of a whole training block would mix the loss
  of the untrained start of the block into L_train.
"""

from __future__ import annotations

import math

from trainguard.modes import ModeKeys
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import Block, LossHistory, fmt, is_complete
from trainguard.rules.params import Param


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


class Overfit(Rule):
    """Validation loss far above training loss for several validation passes."""

    rule_name = "Overfit"
    collections = ("losses",)
    fix_hint = (
        "add regularisation: dropout, weight decay (optimizer weight_decay=...), data augmentation, "
        "or stop early at the best validation loss; or use a smaller model / more training data"
    )

    tensor_regex = Param(list, None, "regexes of the loss tensors (default: the 'losses' collection)", optional=True)
    start_step = Param(int, 0, "ignore validation passes that start before this global step",
                       check=lambda value: None if value >= 0 else "must be >= 0")
    patience = Param(int, 3, "consecutive validation passes above ratio_threshold before firing",
                     check=_positive, documented_default=1)
    ratio_threshold = Param(float, 0.25, "fire when (val - train) / train exceeds this",
                            documented_default=0.1)
    train_window = Param(int, 10, "training losses (the last saved before a validation pass) averaged as L_train",
                         check=_positive)

    def validate(self) -> None:
        self._history = LossHistory(self, tensor_regex=self.tensor_regex, use_losses_collection=True)
        self._done: set[int] = set()  # first steps of the EVAL blocks already judged
        self._streak = 0
        self._last_step = -1

    def check(self, step: int) -> StepResult | None:
        if not is_complete(self.base_trial, step):
            return None
        self._last_step = max(self._last_step, step)
        return self._judge(step, include_open_block=False)

    def finish(self) -> StepResult | None:
        history = self._history
        if not history.names():
            return self.missing(self._last_step, MissingTensor("scalar loss tensors", "losses"))
        if history.from_metrics:
            return self.missing(
                self._last_step,
                MissingTensor("losses of TRAIN and EVAL steps; in XGBoost runs use Overtraining, which watches "
                              "the validation metrics (boosting always drives the training loss far below it)",
                              "losses"),
            )
        if ModeKeys.EVAL not in history.modes_with_losses() or ModeKeys.TRAIN not in history.modes_with_losses():
            return self.missing(
                self._last_step,
                MissingTensor("losses of both TRAIN and EVAL steps (run validation under hook.set_mode(modes.EVAL))",
                              "losses"),
            )
        return self._judge(self._last_step, include_open_block=True)

    def _judge(self, step: int, *, include_open_block: bool) -> StepResult | None:
        history = self._history
        blocks = history.blocks(upto=None if include_open_block else step)
        if not blocks:
            return None
        common = history.mode_names(ModeKeys.TRAIN) & history.mode_names(ModeKeys.EVAL)
        if not common:
            return None
        judged: list[dict[str, float | int]] = []
        fired: dict[str, float | int] | None = None
        for index, block in enumerate(blocks):
            if block.mode != ModeKeys.EVAL or block.first in self._done or block.first < self.start_step:
                continue
            closed = index + 1 < len(blocks) or include_open_block
            if not closed:
                continue
            self._done.add(block.first)
            facts = self._ratio(block, blocks[:index], common)
            if facts is None:
                continue
            self._streak = self._streak + 1 if facts["ratio"] > self.ratio_threshold else 0
            facts["streak"] = self._streak
            judged.append(facts)
            if self._streak >= self.patience:
                fired = facts
        if not judged:
            return None
        step = max(step, int(judged[-1]["eval_last_step"]))
        if fired is not None:
            return self.issue(
                step,
                f"validation loss {fmt(fired['eval_loss'])} is {fmt(100 * fired['ratio'])} % above the training loss "
                f"{fmt(fired['train_loss'])} (ratio_threshold {fmt(self.ratio_threshold)}) for {self._streak} "
                f"consecutive validation pass(es) (patience {self.patience})",
                passes=judged,
            )
        return self.no_issue(step, passes=judged)

    def _ratio(self, block: Block, before: list[Block], names: set[str]) -> dict[str, float | int] | None:
        train_steps = [s for previous in before if previous.mode == ModeKeys.TRAIN for s in previous.steps]
        train_steps = train_steps[-self.train_window:]
        train = self._history.mean(train_steps, names)
        evaluation = self._history.mean(block.steps, names)
        if train is None or evaluation is None or not math.isfinite(train) or not math.isfinite(evaluation):
            return None
        if train == 0:
            return None
        ratio = (evaluation - train) / abs(train)
        return {"eval_first_step": block.first, "eval_last_step": block.last, "eval_loss": evaluation,
                "train_loss": train, "ratio": ratio}
