"""ClassImbalance: some classes are far rarer than others, or one class is mostly mispredicted.

Formula. Labels ``y`` and predicted classes ``ŷ`` are accumulated over the evaluated steps
(each step once). With ``n_c`` the number of labels of class c seen so far (classes that
occurred at least once), once ``Σ n_c >= samples``:

    imbalance:      max_c n_c / min_c n_c > threshold_imbalance
    misprediction:  B = the classes c with >= 10 samples in the window whose rate
                    |{i in window: y_i = c, ŷ_i != c}| / |{i in window: y_i = c}| > threshold_misprediction;
                    B is not empty, holds at most half of those classes, and the labels of the
                    others are mispredicted at most 1 - threshold_misprediction of the time (pooled)

where the window is the last ``samples`` labels saved at global steps >= ``misprediction_start_step``
(the misprediction check waits until the window is full). Class ids: see ``_classification``
(logits are argmaxed over the class axis; ``argmax=True`` forces it).

Tensors: ``labels_regex`` ∪ collection ``labels`` and ``predictions_regex`` ∪ collection
``predictions`` (the PyTorch hook files a loss module's target and input there).

Calibrated default: ``misprediction_start_step`` (trainguard only) 100 (10 in XGBoost runs,
whose steps are boosting rounds; unset = this automatic choice), and mispredictions
over a sliding window instead of since the start. SageMaker counts mispredictions from the
first step, when an untrained model mispredicts almost every class, so the documented rule
fires on every healthy run; the imbalance check is unchanged (label counts do not depend on
training progress). ``threshold_misprediction`` keeps its documented 0.7. Several labels per
sample of the model's input (a language model's next tokens, batch x sequence length of the token
ids it reads; a segmentation's pixels; a multi-label's indicators) are frequencies of a vocabulary,
a background or a sparsity, not a sampling fault: the imbalance check judges one label per sample. And a class-specific
failure is what the misprediction check reports: when most classes are mispredicted, the model
has not learned yet (a slow start, a warm-up: measured, an MLP on learnable labels still
predicting one class of ten at step 170), or cannot learn (random labels, a learning rate far too
small: a 5-class MLP at its random start got 2 classes 70-97 % wrong and the others 19-68 %),
which Underfitting and LossNotDecreasing judge; ClassImbalance stays silent then
(``class_specific=False``: SageMaker's any-class check). A class-specific failure must also last:
a class first found mispredicted (so) at step s is reported once it still is at step 2 s, or at the
last step of a run that ended (a model that learns its classes one after another, as an MLP on
learnable labels does, measured: class 8 of 10 97 % wrong at step 470 and learned soon after, is
in the middle of learning, not failing a class). Doubling the step keeps the wait in proportion
to the run instead of a number of steps tuned to one program.

A target is a class label only where the loss and the label space say so: next-token and
per-token targets over a vocabulary (``_classification.vocabulary_targets``: the targets are the
input tokens shifted by one, or one per input token over an output space covering the input's
vocabulary, or per-position targets over a vocabulary-sized class axis) are not judged at all; a
run with only those is "not evaluated: per-token targets over a vocabulary".

One class only: when every one of ``samples`` labels (or more) is the same class while the model
scores two or more classes on a class axis (``N×C`` logits, C >= 2), the data holds no other class
to learn (a labelling or loading bug: "all labels one class"); reported as imbalance (infinite
ratio). One score per binary label is not judged so: a GAN's discriminator is trained on all-1
targets for real samples and all-0 ones for generated samples, by design, and the two cannot be
told from a binary classifier whose labels were all loaded as 1.

Batch-source targets (``_batch_source``): when every label tensor read (each of at least 8 labels)
holds a single value while different tensors hold different values, the targets name where each
batch came from (real or generated samples for a GAN's discriminator, source or target domain),
not a class of each example: the rule says "not evaluated" instead of reporting the generator
fooling the discriminator as a mispredicted class. A classifier fed batches sorted by class (an
unshuffled loader) looks the same and is not judged either.

The imbalance and one-class findings describe the data: they are advice (trainguard.rules.advice);
the misprediction finding is a symptom.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from trainguard.config.loss_kinds import has_class_targets, loss_kind_of_tensor
from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._batch_source import BatchSourceTargets
from trainguard.rules.builtin._classification import (
    class_count,
    class_ids,
    default_start_step,
    label_prediction_pairs,
    per_token_reason,
    regex_problem,
    token_inputs,
    vocabulary_targets,
)
from trainguard.rules.builtin._data_inputs import data_inputs
from trainguard.rules.builtin._losses import fmt, is_complete, read_values
from trainguard.rules.params import Param

_MIN_CLASS_SAMPLES = 10  # a class seen twice and missed twice is not a 100 % misprediction rate
_REWEIGHT_HINT = (
    "reweight classes: CrossEntropyLoss(weight=1/class_frequency) or sample with a "
    "torch.utils.data.WeightedRandomSampler; or over-/under-sample the data set"
)


class ClassImbalance(Rule):
    """Rare classes, or a class the model keeps getting wrong."""

    rule_name = "ClassImbalance"
    collections = ("labels", "predictions")
    reads_only_collections = True  # no labels nor predictions: a regression (Rule.inapplicable)
    # the run's framework unknown: name each framework's way (never one framework's API unlabelled)
    fix_hint = (
        "reweight classes in the loss (weight = 1/class frequency; PyTorch: CrossEntropyLoss(weight=...) or a "
        "WeightedRandomSampler; Keras: fit(class_weight=...)) or over-/under-sample the data set"
    )
    fix_hints = {
        "pytorch": _REWEIGHT_HINT,
        "keras": "reweight classes: model.fit(class_weight={class: 1/frequency}) or over-/under-sample the data set",
        "xgboost": "reweight classes: scale_pos_weight (binary) or per-sample weights in DMatrix(weight=...)",
    }

    threshold_imbalance = Param(float, 10.0, "fire when the most/least frequent class ratio exceeds this",
                                check=lambda value: None if value >= 1 else "must be >= 1")
    threshold_misprediction = Param(float, 0.7, "fire when a class's misprediction fraction exceeds this",
                                    check=lambda value: None if 0 <= value <= 1 else "must be in [0, 1]")
    samples = Param(int, 500, "labels needed before judging (and the misprediction window)",
                    check=lambda value: None if value > 0 else "must be > 0")
    argmax = Param(bool, False, "argmax the predictions (automatic for logits with a class axis)")
    labels_regex = Param(str, ".*labels", "regex of the label tensors (the 'labels' collection is also used)",
                         check=regex_problem)
    predictions_regex = Param(str, ".*predictions", "regex of the prediction tensors (also 'predictions')",
                              check=regex_problem)
    misprediction_start_step = Param(int, None, "global step from which predictions count for mispredictions "
                                     "(default: 100; 10 rounds in XGBoost runs)", optional=True,
                                     check=lambda value: None if value >= 0 else "must be >= 0",
                                     documented_default=0)
    class_specific = Param(bool, True, "report mispredictions only while most classes are learned (at most half "
                           "over threshold_misprediction, the others right >= 1 - threshold_misprediction) and "
                           "only once a class first found so at step s still is at step 2 s (or at the end)",
                           documented_default=False)

    def validate(self) -> None:
        self._counts: dict[int, int] = {}
        self._window: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._window_size = 0
        self._seen: set[int] = set()
        # class -> the step from which it has been mispredicted (class-specifically) at every
        # evaluated step, and the last step that bookkeeping was done for (checks may repeat)
        self._bad_since: dict[int, int] = {}
        self._tracked_up_to = -1
        self._at_last_step: tuple[int, dict[int, float], dict[str, Any]] | None = None
        self._not_classes = 0  # label tensors read that hold no class ids (regression targets)
        self._dense_labels: bool | None = None  # several labels per input sample
        self._per_token = 0  # label tensors read that are per-token targets over a vocabulary
        self._classes_scored = 0  # the most classes the predictions scored
        self._sources = BatchSourceTargets()

    def finish(self) -> StepResult | None:
        if self._at_last_step is not None and self.base_trial.training_ended:
            step, bad, details = self._at_last_step
            self._at_last_step = None
            if step == self._tracked_up_to:  # still mispredicted when training ended
                return self._misprediction_issue(step, bad, {**details, "at_end_of_training": True})
        if not self._counts and self._per_token:
            return self.not_evaluated(per_token_reason(self.name()))
        if not self._counts and self._not_classes:
            return self.not_evaluated(
                "the labels are not class ids (non-integer targets: a regression loss?); ClassImbalance "
                "judges classification runs"
            )
        return None

    def _pairs(self, step: int) -> list[tuple[str, str]]:
        return label_prediction_pairs(
            self.base_trial, step,
            label_regexes=[self.labels_regex], prediction_regexes=[self.predictions_regex],
            label_collections=["labels"], prediction_collections=["predictions"],
        )

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        pairs = self._pairs(step)
        if not pairs:
            if trial.training_ended and not self._counts and not self._has_any_labels():
                other = self._losses_without_class_targets()
                if other:
                    return self.not_evaluated(
                        f"the run's losses ({', '.join(other)}) compare predictions with regression or distribution "
                        "targets, not class labels; ClassImbalance judges classification runs", step,
                    )  # fmt: skip
                return self.missing(step, MissingTensor("labels and predictions (loss inputs)", "labels"),
                                    MissingTensor("predictions", "predictions"))
            return None
        if step not in self._seen:
            self._seen.add(step)
            self._add(step, pairs)
        if not self._counts and self._per_token:
            return None  # per-token targets over a vocabulary: not classes (finish() says so)
        total = sum(self._counts.values())
        details: dict[str, Any] = {"samples_seen": total, "class_counts": dict(sorted(self._counts.items()))}
        if total < self.samples:
            return self.no_issue(step, f"waiting for {self.samples} labels ({total} so far)", **details)
        counts = np.array([count for count in self._counts.values() if count > 0])
        ratio = float(counts.max() / counts.min()) if counts.size >= 2 else 1.0
        details["imbalance_ratio"] = ratio
        rates = self._misprediction_rates()
        details["misprediction_rates"] = rates
        if counts.size >= 2 and self._sources.holds():
            return self.not_evaluated(self._sources.reason(), step)
        if self._dense_labels:
            details["token_level"] = True  # several labels per sample: a vocabulary, pixels
        elif counts.size == 1 and self._classes_scored >= 2:
            only = next(iter(self._counts))
            return self.issue(
                step,
                f"every one of the {total} labels is class {only}, while the model scores {self._classes_scored} "
                "classes: the data holds no other class (check the labels and how they are loaded)",
                fix_hint=f"check the labels: all {total} are class {only} (a labelling or loading bug?); "
                "a classifier needs examples of every class",
                **{**details, "imbalance_ratio": float("inf")},
            )
        elif ratio > self.threshold_imbalance:
            rare = min(self._counts, key=lambda c: self._counts[c])
            common = max(self._counts, key=lambda c: self._counts[c])
            return self.issue(
                step,
                f"class {common} has {fmt(ratio)}x as many labels as class {rare} "
                f"({self._counts[common]} vs {self._counts[rare]}; "
                f"threshold_imbalance {fmt(self.threshold_imbalance)})",
                **details,
            )
        bad = {c: rate for c, rate in rates.items() if rate > self.threshold_misprediction}
        if bad and self.class_specific and not self._others_learned(bad, rates):
            details["not_learned_yet"] = True  # most classes mispredicted: not this rule's finding
            bad = {}
        if self.class_specific:
            bad = self._lasting(step, bad, details)
        if bad:
            return self._misprediction_issue(step, bad, details)
        return self.no_issue(step, **details)

    def _misprediction_issue(self, step: int, bad: dict[int, float], details: dict[str, Any]) -> StepResult:
        worst = max(bad, key=lambda c: bad[c])
        return self.issue(
            step,
            f"class {worst} is mispredicted {fmt(100 * bad[worst])} % of the time in the last {self._window_size} "
            f"labels (threshold_misprediction {fmt(self.threshold_misprediction)}); "
            f"{len(bad)} class(es) above the threshold",
            fix_hint=f"class {worst} is mostly predicted wrong: check its labels, add examples of it, or "
            + self.hint_for(self.framework()).replace("reweight classes", "weight it up", 1),
            **details,
        )

    def _lasting(self, step: int, bad: dict[int, float], details: dict[str, Any]) -> dict[int, float]:
        """The classes of ``bad`` mispredicted at every evaluated step since a step s <= step / 2.
        Those not yet lasting are kept for :meth:`finish`: still mispredicted at the last step of
        an ended run, they are the trained model's failure."""
        if step > self._tracked_up_to:
            self._tracked_up_to = step
            self._bad_since = {c: self._bad_since.get(c, step) for c in bad}
        if self._bad_since:
            details["mispredicted_since"] = dict(sorted(self._bad_since.items()))
        lasting = {c: rate for c, rate in bad.items() if step >= 2 * self._bad_since.get(c, step + 1)}
        self._at_last_step = (step, bad, details) if bad and not lasting else None
        return lasting

    def _others_learned(self, bad: dict[int, float], judged: dict[int, float]) -> bool:
        """Whether the mispredicted classes ``bad`` are a class-specific failure: at most half of
        the ``judged`` classes, and the model right on the others at least
        ``1 - threshold_misprediction`` of the time (pooled over their labels in the window)."""
        if 2 * len(bad) > len(judged):
            return False
        y = np.concatenate([item[0] for item in self._window])
        predicted = np.concatenate([item[1] for item in self._window])
        others = np.isin(y, [c for c in judged if c not in bad])
        return bool(others.any()) and float(np.mean(predicted[others] != y[others])) <= 1 - self.threshold_misprediction

    def _losses_without_class_targets(self) -> list[str]:
        """The run's losses, when every one is known not to take class labels (MSELoss, kl_div...)."""
        trial = self.base_trial
        if "losses" not in trial.collections():
            return []
        kinds = {loss_kind_of_tensor(name) for name in trial.tensor_names(collection="losses")}
        kinds.discard("backward")  # the zero-code hook's loss of a backward() without a loss function
        if not kinds or None in kinds or any(has_class_targets(kind) for kind in kinds if kind):
            return []
        return sorted(kind for kind in kinds if kind)

    def _has_any_labels(self) -> bool:
        trial = self.base_trial
        if "labels" in trial.collections() and trial.tensor_names(collection="labels"):
            return True
        return bool(trial.tensor_names(regex=[self.labels_regex]))

    def _add(self, step: int, pairs: list[tuple[str, str]]) -> None:
        names = sorted({name for pair in pairs for name in pair})
        values = read_values(self.base_trial, names, step)
        tokens = token_inputs(self.base_trial, step)
        for label_name, prediction_name in pairs:
            if label_name not in values or prediction_name not in values:
                continue
            if vocabulary_targets(values[label_name], values[prediction_name], tokens):
                self._per_token += 1
                continue
            scored = class_count(values[label_name], values[prediction_name]) or 0
            self._classes_scored = max(self._classes_scored, scored)
            ids = class_ids(values[label_name], values[prediction_name], argmax=self.argmax)
            if ids is None:
                self._not_classes += 1
                continue
            y, predicted = ids
            self._sources.add(y)
            if self._dense_labels is None:
                self._dense_labels = self._several_labels_per_sample(step, values[label_name])
            for cls, count in zip(*np.unique(y, return_counts=True), strict=False):
                self._counts[int(cls)] = self._counts.get(int(cls), 0) + int(count)
            if step >= self._misprediction_start() and y.size:
                self._window.append((y, predicted))
                self._window_size += y.size
                while self._window and self._window_size - self._window[0][0].size >= self.samples:
                    self._window_size -= self._window.popleft()[0].size

    def _several_labels_per_sample(self, step: int, labels: np.ndarray) -> bool | None:
        """Whether there are several labels per sample of the model's input (a language model's
        next tokens, a tagger's tags, a segmentation's pixels, a multi-label's indicators) rather
        than one; None while no model input is seen."""
        names = data_inputs(self.base_trial, step)
        if not names:
            return None
        for value in read_values(self.base_trial, names, step).values():
            array = np.asarray(value)
            if array.ndim >= 2 and array.shape[0] > 0:
                size = np.asarray(labels).size
                return size % array.shape[0] == 0 and size // array.shape[0] > 1
        return False

    def _misprediction_start(self) -> int:
        if self.misprediction_start_step is not None:
            return self.misprediction_start_step
        return default_start_step(self.base_trial)

    def _misprediction_rates(self) -> dict[int, float]:
        if self._window_size < self.samples:
            return {}
        y = np.concatenate([item[0] for item in self._window])
        predicted = np.concatenate([item[1] for item in self._window])
        rates = {}
        for cls, count in zip(*np.unique(y, return_counts=True), strict=False):
            if count >= _MIN_CLASS_SAMPLES:
                rates[int(cls)] = float(np.mean(predicted[y == cls] != cls))
        return rates
