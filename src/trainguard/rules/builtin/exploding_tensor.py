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

from trainguard.modes import ModeKeys
from trainguard.rules.base import StepResult
from trainguard.rules.builtin._gradient_growth import GradientGrowth
from trainguard.rules.builtin._helpers import (
    all_finite,
    check_regexes,
    is_complete,
    names_at,
    read_values,
    select,
    training_mode,
)
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin._persistence import TensorRule
from trainguard.rules.params import SAGEMAKER, Param, semantics_param

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
    stop_policy = (
        "stops training at the first step with a NaN (or, unless only_nan, infinite) value, or when gradients "
        "growing like a running sum held at window consecutive training steps (calibrated semantics)"
    )
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
    semantics = semantics_param()
    growth = Param(float, 10.0, "calibrated: gradients this many times their first saved norm may be accumulating "
                   "(trainguard)", check=lambda value: None if value > 1 else "must be > 1")
    alignment = Param(float, 0.9, "calibrated: the cosine every saved gradient must have with the one before "
                      "(trainguard)", check=lambda value: None if -1 < value < 1 else "must be in (-1, 1)")
    window = Param(int, 5, "calibrated: saved training steps the growing-gradient signature must span (trainguard)",
                   check=lambda value: None if value >= 2 else "must be >= 2")
    growth_hints = {
        "pytorch": (
            "call optimizer.zero_grad() once per optimizer step, before loss.backward() (gradients add up in "
            ".grad otherwise); if it is called, the update climbs the loss: check that the loss is not negated "
            "(a maximised loss grows its gradients the same way), then lower the learning rate or clip gradients"
        ),
    }
    growth_hint = (
        "reset the gradients once per optimizer step (zero_grad); if they are reset, check that the loss is not "
        "negated, then lower the learning rate or clip gradients"
    )

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")
        self._growth = GradientGrowth(self.base_trial, self.growth, self.alignment, self.window)
        self._growth_streak = 0

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
            grown = self._grown(step, floats)
            if grown is not None:
                return grown
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

    def _grown(self, step: int, floats: dict[str, np.ndarray]) -> StepResult | None:
        """The growing-gradient finding at a saved training step (calibrated semantics), or None."""
        trial = self.base_trial
        if self.semantics == SAGEMAKER or "gradients" not in trial.collections():
            return None
        mode = training_mode(trial)
        if mode != ModeKeys.GLOBAL and trial.mode(step) != mode:
            return None
        saved = set(trial.tensor_names(collection="gradients"))
        gradients = {name: array for name, array in floats.items() if name in saved and array.dtype.kind == "f"}
        facts = self._growth.judge(step, gradients, mode)
        self._growth_streak = self._growth_streak + 1 if facts is not None else 0
        if facts is None:
            return None
        framework = self.framework() or ""
        return self.issue(
            step,
            self._growth.message(facts, step),
            fix_hint=self.growth_hints.get(framework, self.growth_hint),
            certain=self._growth_streak >= self.window,
            gradient_growth=dict(facts),
            evaluations=self._growth_streak,
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
