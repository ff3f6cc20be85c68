"""VanishingGradient: the model's gradient flow has vanished.

Calibrated semantics (default): at each saved step, the gradients of the model are judged as a
whole. A gradient tensor counts as vanished when the mean absolute value of its non-zero
elements is below ``threshold`` (an all-zero tensor counts as 0); the step's condition holds when
at least ``layer_fraction`` of the judged gradient tensors vanished while some gradient is still
at least ``signal_factor`` times ``threshold`` (the signal reaches the output side and vanishes
on its way back; a model whose every gradient is tiny has converged or memorised its data).
The rule fires when the condition held at most of the last ``window`` evaluated steps (certain:
at all of a full window).
Not judged, because their gradient is zero by construction (see ``_persistence``): attention key
biases, frozen parameters (no gradient saved), a weight gradient that is zero while its layer's
bias gradient is not (all-zero inputs in that batch), and the exactly-zero elements of an
otherwise non-zero gradient (embedding rows of tokens absent from the batch). Non-finite
gradients are ExplodingTensor's finding and are skipped here.

``semantics="sagemaker"``: SageMaker's documented condition, ``fire at step s if ∃ g ∈ gradients:
mean(|g_s|) < threshold`` (``rule_to_invoke`` ``VanishingGradient``, threshold 1e-7).
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import all_finite, as_float, fmt, is_complete, read_values, select
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.builtin._persistence import PersistentRule, is_key_bias, zero_input_weight
from trainguard.rules.params import Param

_MODEL = "model"  # the persistence key: the model's gradient flow as a whole


class VanishingGradient(PersistentRule):
    """Gradients so small that the layers they reach stop learning."""

    rule_name = "VanishingGradient"
    collections = ("gradients",)
    needs = "no gradients were saved (save the 'gradients' collection)"
    stop_policy = (
        "stops training when gradients vanished in at least layer_fraction of the model at every step "
        "of a full window; SageMaker semantics never stop"
    )
    fix_hint = (
        "use ReLU/LeakyReLU instead of sigmoid/tanh in deep stacks, add normalisation layers or residual "
        "connections, and use Xavier/He initialisation"
    )
    fix_hints = {
        "pytorch": (
            "use ReLU/LeakyReLU instead of sigmoid/tanh in deep stacks, add BatchNorm/LayerNorm or residual "
            "connections, and use Xavier/He initialisation (torch.nn.init.kaiming_normal_)"
        ),
        "keras": (
            "use 'relu' instead of 'sigmoid'/'tanh' activations in deep stacks, add BatchNormalization or "
            "residual connections, and use kernel_initializer='he_normal' or 'glorot_uniform'"
        ),
        "xgboost": "gradients of a tree model do not vanish; check the objective and base_score",
    }

    threshold = Param(
        float,
        1e-7,
        "a gradient whose mean absolute (non-zero) value is below this vanished",
        check=lambda value: None if value >= 0 else "must be >= 0",
    )
    layer_fraction = Param(
        float,
        0.25,
        "calibrated: fire when at least this fraction of the judged gradient tensors vanished (trainguard)",
        check=lambda value: None if 0 < value <= 1 else "must be in (0, 1]",
    )

    signal_factor = Param(
        float,
        100.0,
        "calibrated: fire only while some gradient is at least this many times threshold (trainguard)",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )

    def _mean_abs(self, step: int, name: str, value: np.ndarray) -> float | None:
        """mean(|g|) in float64 (calibrated: over the non-zero elements); None for empty,
        non-finite or non-numeric gradients."""
        raw = np.asarray(value)
        if raw.dtype.kind == "f":
            if raw.size == 0 or not all_finite(self.base_trial, step, name, raw):
                return None
            # |x| is exact in any float precision: abs written straight into float64 gives
            # the very values widening first did, in one pass instead of two
            magnitudes = np.abs(raw, out=np.empty(raw.shape, dtype=np.float64))
        else:
            array = as_float(value)
            if array is None or array.size == 0 or not np.all(np.isfinite(array)):
                return None
            magnitudes = np.abs(array)
        if self.single_step:
            return float(np.mean(magnitudes))
        nonzero = np.count_nonzero(magnitudes)
        return float(np.sum(magnitudes) / nonzero) if nonzero else 0.0

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        if "gradients" not in trial.collections() or not trial.tensor_names(collection="gradients"):
            if trial.training_ended:
                return self.missing(step, MissingTensor("gradients", "gradients"))
            return None
        names = select(self, step, collections=["gradients"])
        if not names:
            return None
        values = read_values(trial, names, step)
        excluded: list[str] = []
        if self.calibrated:
            for name in list(values):
                if is_key_bias(name) or zero_input_weight(name, np.asarray(values[name]), values):
                    excluded.append(name)
            judged = {name: value for name, value in values.items() if name not in excluded}
        else:
            judged = values
        means = {
            name: mean
            for name, mean in map_tensors(lambda name, value: self._mean_abs(step, name, value), judged).items()
            if mean is not None
        }
        if not means:
            return None
        smallest = min(means, key=means.__getitem__)
        vanished = {name: mean for name, mean in means.items() if mean < self.threshold}
        if self.single_step:
            held = bool(vanished)
        else:
            # the signal reaches some layer (the output side) but vanishes on its way back; when
            # every gradient is tiny the loss is flat (converged, memorised): not a flow problem
            reaches = means[max(means, key=means.__getitem__)] >= self.signal_factor * self.threshold
            held = reaches and len(vanished) >= max(1.0, self.layer_fraction * len(means))
        fire, certain = self.persisted(_MODEL, held)
        if fire:
            name = min(vanished, key=vanished.__getitem__)
            return self.issue(
                step,
                f"{len(vanished)} of {len(means)} gradient(s) vanished {self.persistence_text(_MODEL)}: "
                f"mean |{name}| = {fmt(vanished[name])} < threshold {fmt(self.threshold)}",
                certain=certain,
                tensor=name,
                mean_abs=vanished[name],
                threshold=self.threshold,
                vanished=vanished,
                not_judged=excluded,
            )
        return self.no_issue(
            step,
            tensor=smallest,
            min_mean_abs=means[smallest],
            vanished_count=len(vanished),
            judged=len(means),
            not_judged=excluded,
        )
