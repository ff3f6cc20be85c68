"""AllZero: ``fire at step s if ∃ t: 100 · count(t_s == 0) / size(t_s) ≥ threshold``.

SageMaker ``rule_to_invoke``: ``AllZero``; parameters ``collection_names``, ``tensor_regex``
(union of both) and ``threshold`` (100 %, as documented).

Deviation: SageMaker requires ``collection_names`` or ``tensor_regex``. trainguard's default
selection, when neither is given, is the ``weights`` and ``gradients`` collections — not
biases, which are legitimately all zero at initialisation (rules.md, "Measured"), and not
activations, which DeadRelu judges. Empty tensors are skipped.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import check_regexes, fmt, is_complete, read_values, select
from trainguard.rules.params import Param

DEFAULT_COLLECTIONS = ("weights", "gradients")


class AllZero(Rule):
    """Tensors that are (almost) entirely zero."""

    rule_name = "AllZero"
    collections = DEFAULT_COLLECTIONS
    fix_hint = (
        "check the initialisation (an all-zero weight never breaks symmetry: use the default or "
        "torch.nn.init.kaiming_normal_), and that the data and gradients reaching this tensor are not zero"
    )

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
        zeros: dict[str, float] = {}
        most = 0.0
        for name, value in read_values(trial, names, step).items():
            array = np.asarray(value)
            if array.size == 0 or array.dtype.kind not in "fciub":
                continue
            percent = 100.0 * float(np.count_nonzero(array == 0)) / array.size
            most = max(most, percent)
            if percent >= self.threshold:
                zeros[name] = percent
        if zeros:
            name = sorted(zeros)[0]
            return self.issue(
                step,
                f"{len(zeros)} tensor(s) are ≥ {fmt(self.threshold)}% zeros, e.g. {name} ({fmt(zeros[name])}%)",
                tensor=name,
                zero_percent=zeros[name],
                tensors=zeros,
            )
        return self.no_issue(step, max_zero_percent=most)
