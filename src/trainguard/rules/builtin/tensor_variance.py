"""TensorVariance: ``fire at step s if ∃ t: var(t_s) > max_threshold`` (when set) ``or var(t_s) < min_threshold``
(when set); population variance over all elements.

SageMaker ``rule_to_invoke``: ``TensorVariance``; parameters ``collection_names``,
``tensor_regex``, ``max_threshold`` (None), ``min_threshold`` (None), as documented. With
neither threshold the rule could never fire, so trainguard refuses that configuration (a
ConfigError naming both parameters). Deviation: with neither ``collection_names`` nor
``tensor_regex`` the ``weights`` collection is inspected. Non-finite values (ExplodingTensor's
finding) and tensors with fewer than 2 elements are skipped.

Calibrated semantics (default): a tensor fires when its variance was out of bounds at most of
its last ``window`` evaluations (certain: all of a full window). ``semantics="sagemaker"``: at
every step on its own.
"""

from __future__ import annotations

import numpy as np

from trainguard.errors import ConfigError
from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import as_float, check_regexes, fmt, is_complete, read_values, select
from trainguard.rules.builtin._persistence import PersistentRule
from trainguard.rules.params import Param


class TensorVariance(PersistentRule):
    """Tensors whose variance is outside [min_threshold, max_threshold]."""

    rule_name = "TensorVariance"
    collections = ("weights",)
    needs = "no weights (or the selected tensors) with finite values were saved"
    stop_policy = (
        "stops training when a variance was out of bounds at every evaluation of a full window; SageMaker "
        "semantics never stop"
    )
    fix_hint = (
        "very high variance: lower the learning rate or add weight decay / normalisation; very low "
        "variance: check the initialisation and that the tensor is being trained"
    )

    collection_names = Param(list, None, "collections to inspect (default: weights)")
    tensor_regex = Param(list, None, "regexes of tensor names to inspect")
    max_threshold = Param(float, None, "fire when a variance is above this")
    min_threshold = Param(float, None, "fire when a variance is below this")

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")
        if self.max_threshold is None and self.min_threshold is None:
            raise ConfigError(
                f"{self.name()}: give max_threshold and/or min_threshold (e.g. min_threshold=1e-5,max_threshold=10)"
            )
        if (
            self.max_threshold is not None
            and self.min_threshold is not None
            and self.min_threshold > self.max_threshold
        ):
            raise ConfigError(
                f"{self.name()}: min_threshold={self.min_threshold} is above max_threshold={self.max_threshold}"
            )

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        if self.collection_names or self.tensor_regex:
            names = select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        else:
            names = select(self, step, collections=["weights"])
        if not names:
            if (
                trial.training_ended
                and not (self.collection_names or self.tensor_regex)
                and not ("weights" in trial.collections() and trial.tensor_names(collection="weights"))
            ):
                return self.missing(step, MissingTensor("weights", "weights"))
            return None
        variances: dict[str, float] = {}
        for name, value in read_values(trial, names, step).items():
            array = as_float(value)
            if array is None or array.size < 2 or not np.all(np.isfinite(array)):
                continue
            variances[name] = float(np.var(array))
        if not variances:
            return None
        high = {n: v for n, v in variances.items() if self.max_threshold is not None and v > self.max_threshold}
        low = {n: v for n, v in variances.items() if self.min_threshold is not None and v < self.min_threshold}
        fired = {name: self.persisted(name, name in high or name in low) for name in variances}
        high = {n: v for n, v in high.items() if fired[n][0]}
        low = {n: v for n, v in low.items() if fired[n][0]}
        if high or low:
            name = sorted(high or low)[0]
            bound = f"max_threshold {fmt(self.max_threshold)}" if high else f"min_threshold {fmt(self.min_threshold)}"
            return self.issue(
                step,
                f"variance of {name} is {fmt(variances[name])}, {'above' if high else 'below'} {bound} "
                f"{self.persistence_text(name)}",
                certain=any(sure for fire, sure in fired.values() if fire),
                tensor=name,
                variance=variances[name],
                high=high,
                low=low,
            )
        return self.no_issue(step, min_variance=min(variances.values()), max_variance=max(variances.values()))
