"""SaturatedActivation: for each tanh/sigmoid INPUT tensor x (samples × nodes), node j's activity is
``a_j = 100 · mean_over_samples[min < x_ij < max]`` with (min, max) the activation's bounds; a node
is saturated if ``a_j < threshold_inactivity``; fire if ``100 · #saturated / #nodes > threshold_layer``.

SageMaker ``rule_to_invoke``: ``SaturatedActivation``; parameters ``collection_names``,
``tensor_regex`` (default ``".*tanh_input|.*sigmoid_input"``), ``threshold_tanh_min/max``
(-9.4999/9.4999), ``threshold_sigmoid_min/max`` (-23/16.99999), ``threshold_inactivity`` (1.0 %),
``threshold_layer`` (50.0 %), all as documented (final docs; the bounds are where the
activation's derivative falls below 1e-7). Tensors: collections ``tanh_input`` and
``sigmoid_input`` (filled by the PyTorch hook from ``nn.Tanh``/``nn.Sigmoid`` modules) ∪
``tensor_regex`` ∪ ``collection_names``. A tensor uses the sigmoid bounds when it is in
``sigmoid_input`` or its name contains "sigmoid", else the tanh bounds. Nodes as in DeadRelu:
features (2-D), last axis (3-D), channels (4-D/5-D).

Calibrated semantics (default): a layer fires when it was over ``threshold_layer`` at most of
its last ``window`` evaluations (certain: all of a full window). Unlike DeadRelu, node activity
is not pooled across steps: a healthy tanh/sigmoid input is rarely beyond the bounds even in a
batch of one, while in a saturated stack which nodes are saturated shifts from step to step
(pooling measured 40-60 % where each step had 70-80 %). ``semantics="sagemaker"``: the
documented single-step condition.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import (
    activation_axes,
    as_float,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
)
from trainguard.rules.builtin._persistence import PersistentRule
from trainguard.rules.params import Param


def activation_kind(trial: Any, name: str) -> str:
    """The activation of a tanh/sigmoid input: "sigmoid" when in ``sigmoid_input`` or so named, else "tanh"."""
    if "sigmoid" in name.lower():
        return "sigmoid"
    if "sigmoid_input" in trial.collections() and trial.collection("sigmoid_input").matches(name):
        return "sigmoid"
    return "tanh"


def flat_bound(kind: str, derivative: float) -> float:
    """The |x| beyond which the activation's derivative is below ``derivative`` times its maximum:
    tanh' = 1 - tanh² (maximum 1), sigmoid' = σ(1 - σ) (maximum 1/4); since tanh(x) = 2σ(2x) - 1,
    sigmoid's bound is twice tanh's. 0.01 gives 2.99 for tanh, 5.99 for sigmoid."""
    root = math.sqrt(1.0 - derivative)
    tanh_bound = math.atanh(root)
    return 2.0 * tanh_bound if kind == "sigmoid" else tanh_bound


def _percent(value: float) -> str | None:
    return None if 0 <= value <= 100 else "must be a percentage between 0 and 100"


class SaturatedActivation(PersistentRule):
    """tanh/sigmoid layers whose inputs sit where the activation is flat."""

    rule_name = "SaturatedActivation"
    collections = ("tanh_input", "sigmoid_input")
    needs = (
        "no tanh/sigmoid inputs were captured (nn.Tanh/nn.Sigmoid modules or the tanh_input/sigmoid_input collections)"
    )
    stop_policy = (
        "stops training when a layer was saturated at every evaluation of a full window; SageMaker semantics never stop"
    )
    fix_hint = (
        "scale down the initial weights (Xavier/Glorot initialisation), normalise the inputs, add a "
        "normalisation layer before the activation, or use ReLU"
    )
    fix_hints = {
        "pytorch": (
            "scale down the initial weights (Xavier init: torch.nn.init.xavier_uniform_), normalise the "
            "inputs, add BatchNorm before the activation, or use ReLU"
        ),
        "keras": (
            "scale down the initial weights (kernel_initializer='glorot_uniform'), normalise the inputs, add "
            "layers.BatchNormalization before the activation, or use activation='relu'"
        ),
    }

    collection_names = Param(list, None, "extra collections of tanh/sigmoid inputs")
    tensor_regex = Param(list, [".*tanh_input|.*sigmoid_input"], "regexes of activation input names", optional=True)
    threshold_tanh_min = Param(float, -9.4999, "tanh input below this is saturated")
    threshold_tanh_max = Param(float, 9.4999, "tanh input above this is saturated")
    threshold_sigmoid_min = Param(float, -23.0, "sigmoid input below this is saturated")
    threshold_sigmoid_max = Param(float, 16.99999, "sigmoid input above this is saturated")
    threshold_inactivity = Param(
        float, 1.0, "a node active in less than this percent of samples is saturated", check=_percent
    )
    threshold_layer = Param(
        float, 50.0, "fire when more than this percent of a layer's nodes are saturated", check=_percent
    )

    def validate(self) -> None:
        from trainguard.errors import ConfigError

        check_regexes(self, "tensor_regex")
        if self.threshold_tanh_min >= self.threshold_tanh_max:
            raise ConfigError(f"{self.name()}: threshold_tanh_min must be < threshold_tanh_max")
        if self.threshold_sigmoid_min >= self.threshold_sigmoid_max:
            raise ConfigError(f"{self.name()}: threshold_sigmoid_min must be < threshold_sigmoid_max")

    def _saturated_percent(self, name: str, inside: np.ndarray) -> float | None:
        counts, samples = np.count_nonzero(inside, axis=0), inside.shape[0]
        if samples == 0 or counts.size == 0:
            return None
        activity = 100.0 * counts / samples
        return 100.0 * float(np.mean(activity < self.threshold_inactivity))

    def _bounds(self, name: str) -> tuple[str, float, float]:
        if activation_kind(self.base_trial, name) == "sigmoid":
            return "sigmoid", self.threshold_sigmoid_min, self.threshold_sigmoid_max
        return "tanh", self.threshold_tanh_min, self.threshold_tanh_max

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = select(
            self,
            step,
            collections=["tanh_input", "sigmoid_input", *(self.collection_names or ())],
            regex=self.tensor_regex,
        )
        if not names:
            if trial.training_ended and not any(
                trial.tensor_names(collection=c) for c in self.collections if c in trial.collections()
            ):
                return self.missing(step, MissingTensor("tanh/sigmoid inputs", "tanh_input"))
            return None
        worst: tuple[float, str] = (-1.0, "")
        fired: dict[str, dict[str, float | str]] = {}
        certain = False
        for name, value in read_values(trial, names, step).items():
            array = as_float(value)
            if array is None or array.size == 0:
                continue
            kind, low, high = self._bounds(name)
            nodes = activation_axes(array)
            with np.errstate(invalid="ignore"):
                inside = (nodes > low) & (nodes < high)  # NaN is outside: a NaN node does nothing
            saturated = self._saturated_percent(name, inside)
            if saturated is None:
                continue
            worst = max(worst, (saturated, name))
            fire, sure = self.persisted(name, saturated > self.threshold_layer)
            certain = certain or sure
            if fire:
                fired[name] = {"saturated_percent": saturated, "activation": kind, "min": low, "max": high}
        if not worst[1]:
            return None
        if fired:
            name = max(fired, key=lambda key: float(fired[key]["saturated_percent"]))
            info = fired[name]
            percent, low, high = float(info["saturated_percent"]), float(info["min"]), float(info["max"])
            return self.issue(
                step,
                f"{fmt(percent)}% of the nodes of {info['activation']} input {name} are saturated "
                f"(outside ({fmt(low)}, {fmt(high)}) in > {fmt(100 - self.threshold_inactivity)}% "
                f"of samples) {self.persistence_text(name)}; threshold_layer {fmt(self.threshold_layer)}%",
                certain=certain,
                tensor=name,
                saturated_percent=info["saturated_percent"],
                layers=fired,
            )
        return self.no_issue(step, tensor=worst[1], max_saturated_percent=worst[0])
