"""Confusion: the confusion matrix shows a predicted class that is often another class.

Formula. ``C[label][prediction] += 1`` over the last ``samples`` labels (a sliding window of
whole steps, the current step included) saved at global steps >= ``start_step``; K =
``category_no`` (default: 1 + the largest class id seen in labels or predictions; ids >= K are
dropped). For every column i (a predicted class) with ``S_i = Σ_j C[j][i] > 0``:

    fire if C[i][i] / S_i < min_diag   or   ∃ j != i: C[j][i] / S_i > max_off_diag

(SageMaker's documentation garbles this formula; this is its reconstruction in rules.md.)
Tensors: regex ``labels`` ∪ collection ``labels_collection``, regex ``predictions`` ∪
collection ``predictions_collection``. Class ids as in ClassImbalance (logits are argmaxed).

Calibrated defaults:

* ``min_diag`` 0.5 (documented 0.9) and ``max_off_diag`` 0.3 (documented 0.1): the documented
  values demand 90 % precision for every predicted class, which a healthy model on a noisy task
  does not reach (an XGBoost classifier at 85 % validation accuracy fires with 26 % of its
  class-1 predictions being class 0). The calibrated values flag a predicted class that is
  mostly wrong, or that is more than 30 % one specific other class: collapsed predictions,
  swapped or noisy labels between two classes.

* ``start_step`` 100, or 10 in XGBoost runs whose steps are boosting rounds (unset = this
  automatic choice; SageMaker: every step from 0): an untrained model's matrix is all
  confusion, so the documented rule fires at the first step of every healthy run.
* ``samples`` 500 (SageMaker: the current step only): one batch has a handful of samples per
  class, and a column with one wrong prediction out of two is noise, not confusion.
  ``samples=1`` restores SageMaker's per-step matrix.
* A share is out of bounds only when it surely is: the 99 % Wilson score interval of the share
  (S_i predictions) lies wholly below ``min_diag`` / above ``max_off_diag``. 15 right of 32
  predictions (47 %) is not "surely under 50 %" (its interval is 27-68 %); 200 of 500 is. The
  detection corpus' healthy runs were flagged by shares of 30-33 predictions just under 50 %.

Next-token and per-token targets over a vocabulary are not classes (``_classification.vocabulary_targets``):
a language model's "confusion" between two successor words is its task's ambiguity, and its matrix
would be vocabulary × vocabulary. Such pairs are skipped; a run with only those is not evaluated.

Batch-source targets (``_batch_source``, as in ClassImbalance): when every label tensor read holds
one value and different tensors different values (a GAN discriminator's real and generated
batches, a domain classifier's source and target batches), the labels say where a batch came from,
not a class of each example; the generator fooling the discriminator would read as "the
predictions of class 1 are class 0". Such runs are not evaluated. A classifier whose loader is
sorted by class (unshuffled) cannot be told apart from the labels alone and is not judged either.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._batch_source import BatchSourceTargets
from trainguard.rules.builtin._classification import (
    class_ids,
    default_start_step,
    label_prediction_pairs,
    per_token_reason,
    regex_problem,
    token_inputs,
    vocabulary_targets,
)
from trainguard.rules.builtin._loss_stats import Z_99
from trainguard.rules.builtin._losses import fmt, is_complete, read_values
from trainguard.rules.params import SAGEMAKER, Param, semantics_param


def _fraction(value: float) -> str | None:
    return None if 0 <= value <= 1 else "must be in [0, 1]"


def wilson_interval(successes: int, total: int, z: float = Z_99) -> tuple[float, float]:
    """The Wilson score interval of the share ``successes / total`` (z = 2.58: 99 %)."""
    share, z2 = successes / total, z * z
    centre = (share + z2 / (2 * total)) / (1 + z2 / total)
    half = z * math.sqrt(share * (1 - share) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return max(0.0, centre - half), min(1.0, centre + half)


class Confusion(Rule):
    """Predictions of a class are too often some other class."""

    rule_name = "Confusion"
    collections = ("labels", "predictions")
    fix_hint = (
        "check the labels of the confused classes (swapped or noisy labels), add examples that separate "
        "them, or weight them up in the loss"
    )
    fix_hints = {
        "pytorch": (
            "check the labels of the confused classes (swapped or noisy labels), add examples that separate "
            "them, or weight them up in the loss (CrossEntropyLoss(weight=...))"
        ),
        "keras": (
            "check the labels of the confused classes (swapped or noisy labels), add examples that separate "
            "them, or weight them up (model.fit(class_weight=...))"
        ),
        "xgboost": (
            "check the labels of the confused classes (swapped or noisy labels), add examples that separate "
            "them, or weight them up (DMatrix(weight=...))"
        ),
    }

    category_no = Param(int, None, "number of classes (default: inferred)", optional=True,
                        check=lambda value: None if value >= 2 else "must be >= 2")
    labels = Param(str, "labels", "regex of the label tensors", check=regex_problem)
    predictions = Param(str, "predictions", "regex of the prediction tensors", check=regex_problem)
    labels_collection = Param(str, "labels", "collection of the label tensors")
    predictions_collection = Param(str, "predictions", "collection of the prediction tensors")
    min_diag = Param(float, 0.5, "minimum share of a predicted class that is really that class", check=_fraction,
                     documented_default=0.9)
    max_off_diag = Param(float, 0.3, "maximum share of a predicted class that is one other class", check=_fraction,
                         documented_default=0.1)
    start_step = Param(int, None, "first global step judged (default: 100; 10 rounds in XGBoost runs)",
                       optional=True, documented_default=0,
                       check=lambda value: None if value >= 0 else "must be >= 0")
    semantics = semantics_param()
    min_predictions = Param(
        int, 30, "calibrated semantics: a predicted class is judged once the window holds this many predictions of "
        "it (a share of 2 predictions is noise: '100 % of class 2 are class 3')",
    )  # fmt: skip
    samples = Param(int, 500, "labels in the sliding window the matrix is built from",
                    documented_default="the current step only",
                    check=lambda value: None if value > 0 else "must be > 0")

    def validate(self) -> None:
        self._window: deque[tuple[int, np.ndarray, np.ndarray]] = deque()
        self._seen: set[int] = set()
        self._per_token = 0  # label tensors skipped as per-token targets over a vocabulary
        self._judged = 0  # label tensors judged as classes
        self._sources = BatchSourceTargets()

    def finish(self) -> StepResult | None:
        if self._per_token and not self._judged and self.base_trial.training_ended:
            return self.not_evaluated(per_token_reason(self.name()))
        return None

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        pairs = label_prediction_pairs(
            trial, step,
            label_regexes=[self.labels], prediction_regexes=[self.predictions],
            label_collections=[self.labels_collection], prediction_collections=[self.predictions_collection],
        )
        if not pairs:
            if trial.training_ended and not self._window and not self._seen:
                return self.missing(step, MissingTensor("labels", self.labels_collection),
                                    MissingTensor("predictions", self.predictions_collection))
            return None
        start = self.start_step if self.start_step is not None else default_start_step(trial)
        if step < start:
            return None
        if step not in self._seen:
            self._seen.add(step)
            self._add(step, pairs)
        if not self._window:
            return None
        if self._sources.holds():
            return self.not_evaluated(self._sources.reason(), step)
        if self._sources.pending():
            return None  # a GAN's first real and fake batches: wait for the verdict
        y = np.concatenate([item[1] for item in self._window])
        predicted = np.concatenate([item[2] for item in self._window])
        size = self.category_no or int(max(y.max(initial=0), predicted.max(initial=0))) + 1
        keep = (y < size) & (predicted < size)
        matrix = np.zeros((size, size), dtype=np.int64)
        np.add.at(matrix, (y[keep], predicted[keep]), 1)
        return self._judge(step, matrix)

    def _add(self, step: int, pairs: list[tuple[str, str]]) -> None:
        values = read_values(self.base_trial, sorted({name for pair in pairs for name in pair}), step)
        tokens = token_inputs(self.base_trial, step)
        for label_name, prediction_name in pairs:
            if label_name in values and prediction_name in values:
                if vocabulary_targets(values[label_name], values[prediction_name], tokens):
                    self._per_token += 1
                    continue
                self._judged += 1
                ids = class_ids(values[label_name], values[prediction_name])
                if ids is not None and ids[0].size:
                    self._sources.add(ids[0])
                    self._window.append((step, ids[0], ids[1]))
        # keep whole steps: drop the oldest while the rest still holds `samples` labels
        total = sum(item[1].size for item in self._window)
        while len(self._window) > 1 and total - self._window[0][1].size >= self.samples:
            total -= self._window.popleft()[1].size

    def _judge(self, step: int, matrix: np.ndarray) -> StepResult:
        column_sums = matrix.sum(axis=0)
        problems: list[dict[str, Any]] = []
        documented = self.semantics == SAGEMAKER
        least = 1 if documented else max(1, self.min_predictions)

        def _bounds(count: int, total: int) -> tuple[float, float]:
            # SageMaker: the share itself; calibrated: where the share surely lies (99 %)
            return (count / total, count / total) if documented else wilson_interval(int(count), int(total))

        for column in np.nonzero(column_sums >= least)[0]:
            total = column_sums[column]
            diag = matrix[column, column] / total
            if _bounds(matrix[column, column], total)[1] < self.min_diag:
                problems.append({"predicted": int(column), "kind": "diag", "share": float(diag)})
            for row in np.nonzero(matrix[:, column])[0]:
                share = matrix[row, column] / total
                if row != column and _bounds(matrix[row, column], total)[0] > self.max_off_diag:
                    problems.append({"predicted": int(column), "label": int(row), "kind": "off_diag",
                                     "share": float(share)})
        details = {"confusion": matrix.tolist(), "samples": int(matrix.sum())}
        if not problems:
            return self.no_issue(step, **details)
        off = [item for item in problems if item["kind"] == "off_diag"]
        if off:
            worst = max(off, key=lambda item: item["share"])
            message = (f"{fmt(100 * worst['share'])} % of the predictions of class {worst['predicted']} are class "
                       f"{worst['label']} (max_off_diag {fmt(self.max_off_diag)})")
        else:
            worst = min(problems, key=lambda item: item["share"])
            message = (f"only {fmt(100 * worst['share'])} % of the predictions of class {worst['predicted']} are "
                       f"right (min_diag {fmt(self.min_diag)})")
        return self.issue(step, f"{message}; {len(problems)} finding(s)", problems=problems, **details)
