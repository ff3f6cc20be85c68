"""ExplodingTensor: ``fire at step s if ∃ t: any(isnan(t_s))`` or, unless ``only_nan``, ``any(isinf(t_s))``.

SageMaker ``rule_to_invoke``: ``ExplodingTensor``; parameters ``collection_names``,
``tensor_regex`` (union of both; every saved tensor when neither is given) and ``only_nan``
(default False), all as documented. Integer and boolean tensors cannot hold NaN and are skipped;
so are XGBoost's tree dumps (``trees/*``: NaN split values mark leaves) unless selected explicitly.

Non-finite values never heal, so this finding is immediate and certain under both semantics:
it is the one tensor-state condition that needs no persistence window. It is also the primary
finding of a run whose NaNs make other rules fire (dead ReLUs, huge update ratios).

One exception, by construction rather than by threshold: an *input* (of the model, in the
collections ``model_inputs``/``derived_inputs``, or of a layer, ``<module>_input_<n>``) whose values
are all ``0`` or ``-inf`` is an additive attention mask (``nn.Transformer.generate_square_subsequent_mask``
passed to the model and on to its encoder, a padding mask built with ``masked_fill(..., -inf)``):
``-inf`` is how such masks say "never attend", and no data holds exactly those two values. A layer
*output* of zeros and ``-inf`` (a ``log`` of a saturated softmax) is still reported; where such a
tensor is then fed on as an input, the loss it produces still shows the overflow.
"""

from __future__ import annotations

import re

import numpy as np

from trainguard.rules.base import StepResult
from trainguard.rules.builtin._helpers import all_finite, check_regexes, is_complete, names_at, read_values, select
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin._persistence import TensorRule
from trainguard.rules.params import Param

_INPUT_COLLECTIONS = ("model_inputs", "derived_inputs")
_LAYER_INPUT = re.compile(r"_input_\d+$")


def is_additive_mask(array: np.ndarray) -> bool:
    """Whether every value is exactly 0 or -inf, with at least one -inf (an additive attention mask)."""
    negative_inf = np.isneginf(array)
    return bool(negative_inf.any()) and not np.count_nonzero(array[~negative_inf])


class ExplodingTensor(TensorRule):
    """NaN or infinite values in any inspected tensor."""

    rule_name = "ExplodingTensor"
    needs = "no floating-point tensor was saved at a complete step"
    stop_policy = "stops training at the first step with a NaN (or, unless only_nan, infinite) value"
    fix_hint = "lower the learning rate or clip gradients; check for log(0), division by zero and unnormalised inputs"
    fix_hints = {
        "pytorch": (
            "lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_); check for "
            "log(0), division by zero and unnormalised inputs"
        ),
        "keras": (
            "lower the learning rate or clip gradients (optimizer clipnorm=1.0); check for log(0), "
            "division by zero and unnormalised inputs"
        ),
        "xgboost": (
            "lower eta, set max_delta_step, and check the labels and features for NaN/inf and the "
            "custom objective for division by zero"
        ),
    }
    # gradients or losses blew up: the optimisation itself diverged
    divergence_hints = {
        "pytorch": "lower the learning rate or clip gradients (torch.nn.utils.clip_grad_norm_)",
        "keras": "lower the learning rate or clip gradients (optimizer clipnorm=1.0)",
        "xgboost": "lower eta or set max_delta_step",
    }

    collection_names = Param(list, None, "collections to inspect (comma-separated)")
    tensor_regex = Param(list, None, "regexes of tensor names to inspect (comma-separated)")
    only_nan = Param(bool, False, "only NaN counts, not +/-inf")

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        if self.collection_names or self.tensor_regex:
            names = select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        else:
            # XGBoost's tree dumps mark leaves with NaN split values by construction: not a number
            # that exploded (asked for explicitly, they are checked like any tensor)
            tree_dumps = set(trial.tensor_names(collection="trees")) if "trees" in trial.collections() else set()
            names = [name for name in names_at(trial, step) if name not in tree_dumps and not name.startswith("trees/")]
        if not names:
            return None
        bad: dict[str, dict[str, int]] = {}
        values = {name: np.asarray(value) for name, value in read_values(trial, names, step).items()}
        floats = {name: array for name, array in values.items() if array.dtype.kind in "fc" and array.size}
        # one pass per tensor, on two cores; the verdicts are shared with the other rules
        finite = map_tensors(lambda name, array: all_finite(trial, step, name, array), floats)
        inputs = self._input_names() if not all(finite.values()) else set()
        for name, array in floats.items():
            if finite[name] or ((name in inputs or _LAYER_INPUT.search(name)) and is_additive_mask(array)):
                continue
            nan = int(np.count_nonzero(np.isnan(array)))
            inf = 0 if self.only_nan else int(np.count_nonzero(np.isinf(array)))
            if nan or inf:
                bad[name] = {"nan": nan, "inf": inf, "size": int(array.size)}
        if not bad:
            return self.no_issue(step, tensors_checked=len(names))
        first = sorted(bad)[0]
        what = "NaN" if self.only_nan else "NaN/inf"
        framework = self.framework()
        hint = self.hint_for(framework)
        if any(name.startswith("gradient/") for name in bad) or any("oss" in name for name in bad):
            hint = self.divergence_hints.get(framework or "", "lower the learning rate or clip gradients")
        return self.issue(
            step,
            f"{len(bad)} tensor(s) hold {what} values, e.g. {first} ({bad[first]['nan']} NaN, {bad[first]['inf']} inf "
            f"of {bad[first]['size']})",
            fix_hint=hint,
            certain=True,
            tensor=first,
            tensors=bad,
        )

    def _input_names(self) -> set[str]:
        trial = self.base_trial
        present = set(trial.collections())
        return {
            name
            for collection in _INPUT_COLLECTIONS
            if collection in present
            for name in trial.tensor_names(collection=collection)
        }
