"""DeadRelu: per ReLU output tensor y (samples × nodes), node j's activity is
``a_j = 100 · mean_over_samples[y_ij > 0]``; a node is dead if ``a_j < threshold_inactivity``;
fire if ``100 · #dead / #nodes > threshold_layer`` for any layer.

SageMaker ``rule_to_invoke``: ``DeadRelu``; parameters ``tensor_regex`` (default
``".*relu_output"``), ``threshold_inactivity`` (1.0 %), ``threshold_layer`` (50.0 %), as
documented (final docs). Tensors: the ``relu_output`` collection (the PyTorch hook puts every
``nn.ReLU`` output there) ∪ ``tensor_regex`` ∪ ``collection_names``. Nodes are features (2-D),
the last axis (3-D sequences) or channels (4-D/5-D, all positions are samples).

``patience`` (trainguard's addition; default 1 = SageMaker's behaviour) requires a layer to be
over ``threshold_layer`` at that many consecutive saved steps, for runs where single batches
leave most of a layer inactive. The documented defaults stayed silent on every healthy run of
the fault suite (docs/rules-calibration.md), so they are kept.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import (
    activation_axes,
    as_float,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
)
from trainguard.rules.params import Param


def _percent(value: float) -> str | None:
    return None if 0 <= value <= 100 else "must be a percentage between 0 and 100"


class DeadRelu(Rule):
    """ReLU layers whose nodes (almost) never activate."""

    rule_name = "DeadRelu"
    collections = ("relu_output",)
    fix_hint = (
        "switch to LeakyReLU, lower the learning rate, or check the bias initialisation "
        "(large negative biases keep ReLUs off)"
    )

    tensor_regex = Param(list, [".*relu_output"], "regexes of ReLU output tensor names", optional=True)
    collection_names = Param(list, None, "extra collections of ReLU outputs")
    threshold_inactivity = Param(
        float, 1.0, "a node active in less than this percent of samples is dead", check=_percent
    )
    threshold_layer = Param(float, 50.0, "fire when more than this percent of a layer's nodes are dead", check=_percent)
    patience = Param(
        int,
        1,
        "consecutive saved steps a layer must be over threshold_layer (trainguard)",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._streak: dict[str, int] = {}

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = select(self, step, collections=["relu_output", *(self.collection_names or ())], regex=self.tensor_regex)
        if not names:
            if trial.training_ended and not select_any(self):
                return self.missing(step, MissingTensor("ReLU outputs", "relu_output"))
            return None
        worst: tuple[float, str] = (-1.0, "")
        fired: dict[str, float] = {}
        for name, value in read_values(trial, names, step).items():
            raw = np.asarray(value)
            # Real numbers compare with 0 the same in any precision and NaN > 0 is False: only
            # complex values need converting (to their magnitude) first.
            array = raw if raw.dtype.kind in "fiub" else as_float(value)
            if array is None or array.size == 0:
                continue
            nodes = activation_axes(array)
            activity = 100.0 * np.mean(nodes > 0, axis=0)
            dead_percent = 100.0 * float(np.mean(activity < self.threshold_inactivity))
            worst = max(worst, (dead_percent, name))
            if dead_percent > self.threshold_layer:
                self._streak[name] = self._streak.get(name, 0) + 1
                if self._streak[name] >= self.patience:
                    fired[name] = dead_percent
            else:
                self._streak[name] = 0
        if worst[1] == "":
            return None
        if fired:
            name = max(fired, key=lambda key: fired[key])
            return self.issue(
                step,
                f"{fmt(fired[name])}% of the ReLUs in {name} are dead (active in < {fmt(self.threshold_inactivity)}% "
                f"of samples) for {self._streak[name]} saved step(s); threshold_layer {fmt(self.threshold_layer)}%",
                tensor=name,
                dead_percent=fired[name],
                layers=fired,
            )
        return self.no_issue(step, tensor=worst[1], max_dead_percent=worst[0])


def select_any(rule: Rule) -> bool:
    """Whether the run has any ReLU output at all (at any step)."""
    trial = rule.base_trial
    if "relu_output" in trial.collections() and trial.tensor_names(collection="relu_output"):
        return True
    return bool(trial.tensor_names(regex=rule.tensor_regex or []))
