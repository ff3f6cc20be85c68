"""AllZero: tensors that are (almost) entirely zero.

Per tensor and step: ``100 · count(t_s == 0) / size(t_s) ≥ threshold``. Calibrated semantics
(default): a tensor fires only when that held at most of its last ``window`` evaluated steps
(certain: at all of a full window), and gradients zero by construction are not judged: attention
key biases, a weight gradient that is zero while its layer's bias gradient is not (all-zero
inputs in that batch, e.g. batch size 1 with an all-zero row), and a bias gradient that is zero
while its layer's weight gradient is not (the bias cancels out of the loss: a siamese net's shared
embedding bias under the distance of two passes). Frozen parameters save no
gradient at all. ``semantics="sagemaker"``: SageMaker's single-step condition.

SageMaker ``rule_to_invoke``: ``AllZero``; parameters ``collection_names``, ``tensor_regex``
(union of both) and ``threshold`` (100 %, as documented).

Deviation: SageMaker requires ``collection_names`` or ``tensor_regex``. trainguard's default
selection, when neither is given, is the ``weights`` and ``gradients`` collections — not
biases, which are legitimately all zero at initialisation (rules.md, "Measured"), and not
activations, which DeadRelu judges. Empty tensors are skipped.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import check_regexes, fmt, is_complete, read_values, select
from trainguard.rules.builtin._persistence import PersistentRule, cancelled_bias, is_key_bias, zero_input_weight
from trainguard.rules.params import Param

DEFAULT_COLLECTIONS = ("weights", "gradients")


class AllZero(PersistentRule):
    """Tensors that are (almost) entirely zero."""

    rule_name = "AllZero"
    collections = DEFAULT_COLLECTIONS
    needs = "no weights or gradients (or the selected tensors) were saved"
    stop_policy = (
        "stops training when a tensor was all zero at every step of a full window; SageMaker semantics never stop"
    )
    fix_hint = (
        "check the initialisation (an all-zero weight never breaks symmetry: use the framework's default "
        "initialiser), and that the data and gradients reaching this tensor are not zero"
    )
    fix_hints = {
        "pytorch": (
            "check the initialisation (an all-zero weight never breaks symmetry: use the default or "
            "torch.nn.init.kaiming_normal_), and that the data and gradients reaching this tensor are not zero"
        ),
        "keras": (
            "check the initialisation (an all-zero kernel never breaks symmetry: use kernel_initializer="
            "'glorot_uniform' or 'he_normal', not 'zeros'), and that the data reaching this layer is not zero"
        ),
        "xgboost": "check that the features and labels are not all zero and that the trees are being built",
    }

    collection_names = Param(
        list,
        None,
        "collections to inspect (default: weights, gradients)",
        documented_default="(required with tensor_regex)",
    )
    tensor_regex = Param(list, None, "regexes of tensor names to inspect")
    threshold = Param(
        float,
        100.0,
        "percent of zero values that fires",
        check=lambda value: None if 0 < value <= 100 else "must be a percentage in (0, 100]",
    )

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        if self.collection_names or self.tensor_regex:
            names = select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        else:
            names = select(self, step, collections=DEFAULT_COLLECTIONS)
        if not names:
            if (
                trial.training_ended
                and not self.collection_names
                and not self.tensor_regex
                and not any(trial.tensor_names(collection=c) for c in DEFAULT_COLLECTIONS if c in trial.collections())
            ):
                return self.missing(step, MissingTensor("weights or gradients", "weights"))
            return None
        values = read_values(trial, names, step)
        zeros: dict[str, float] = {}
        certain: dict[str, bool] = {}
        not_judged: list[str] = []
        most = 0.0
        for name, value in values.items():
            array = np.asarray(value)
            if array.size == 0 or array.dtype.kind not in "fciub":
                continue
            if self.calibrated and name.startswith("gradient/"):
                if is_key_bias(name) or zero_input_weight(name, array, values) or cancelled_bias(name, array, values):
                    not_judged.append(name)
                    continue
            percent = 100.0 * float(np.count_nonzero(array == 0)) / array.size
            most = max(most, percent)
            fire, sure = self.persisted(name, percent >= self.threshold)
            if fire:
                zeros[name] = percent
                certain[name] = sure
        if zeros:
            name = sorted(zeros)[0]
            return self.issue(
                step,
                f"{len(zeros)} tensor(s) are ≥ {fmt(self.threshold)}% zeros {self.persistence_text(name)}, "
                f"e.g. {name} ({fmt(zeros[name])}%)",
                certain=any(certain.values()),
                tensor=name,
                zero_percent=zeros[name],
                tensors=zeros,
                not_judged=not_judged,
            )
        return self.no_issue(step, max_zero_percent=most, not_judged=not_judged)
