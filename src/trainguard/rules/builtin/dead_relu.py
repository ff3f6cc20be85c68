"""DeadRelu: per ReLU output tensor y (samples × nodes), node j's activity is
``a_j = 100 · mean_over_samples[y_ij > 0]``; a node is dead if ``a_j < threshold_inactivity``;
fire if ``100 · #dead / #nodes > threshold_layer`` for any layer.

SageMaker ``rule_to_invoke``: ``DeadRelu``; parameters ``tensor_regex`` (default
``".*relu_output"``), ``threshold_inactivity`` (1.0 %), ``threshold_layer`` (50.0 %), as
documented (final docs). Tensors: the ``relu_output`` collection (the PyTorch hook puts every
``nn.ReLU`` output there) ∪ ``tensor_regex`` ∪ ``collection_names``. Nodes are features (2-D),
the last axis (3-D sequences) or channels (4-D/5-D, all positions are samples).

``patience`` (trainguard's addition; default 1 = SageMaker's behaviour) requires a layer to be
over ``threshold_layer`` at that many consecutive saved steps (under both semantics), for runs where single batches
leave most of a layer inactive. The documented defaults stayed silent on every healthy run of
the fault suite (docs/rules-calibration.md), so they are kept for ``semantics="sagemaker"``.

Calibrated semantics (default): a node's activity is pooled over the samples of the last
``window`` saved steps (a batch of size 1 leaves half the nodes of a healthy layer off at every
step; a dead node stays off for every sample of every batch), ``threshold_layer`` is 90 % (a
very high dead fraction: a healthy ReLU layer has a normal share of zeros), and a layer fires
when it was over it at most of its last ``window`` evaluations (certain: all of a full window).
Non-finite activations are not "dead": NaN compares False with 0, so a NaN layer would look
100 % dead; such tensors are reported as non-finite (ExplodingTensor's finding) and not judged.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.builtin._helpers import (
    activation_axes,
    all_finite,
    as_float,
    check_regexes,
    fmt,
    is_complete,
    read_values,
    select,
)
from trainguard.rules.builtin._persistence import PersistentRule
from trainguard.rules.params import Param


def _percent(value: float) -> str | None:
    return None if 0 <= value <= 100 else "must be a percentage between 0 and 100"


class DeadRelu(PersistentRule):
    """ReLU layers whose nodes (almost) never activate."""

    rule_name = "DeadRelu"
    collections = ("relu_output",)
    needs = "no ReLU outputs were captured (nn.ReLU modules or the relu_output collection)"
    stop_policy = (
        "stops training when a layer was over threshold_layer at every evaluation of a full window; "
        "SageMaker semantics never stop"
    )
    sagemaker_overrides = {"threshold_layer": 50.0}
    fix_hint = (
        "switch to a leaky ReLU, lower the learning rate, or check the bias initialisation "
        "(large negative biases keep ReLUs off)"
    )
    fix_hints = {
        "pytorch": (
            "switch to nn.LeakyReLU, lower the learning rate, or check the bias initialisation "
            "(large negative biases keep ReLUs off)"
        ),
        "keras": (
            "switch to layers.LeakyReLU (or activation='leaky_relu'), lower the learning rate, or check "
            "bias_initializer (large negative biases keep ReLUs off)"
        ),
    }

    tensor_regex = Param(list, [".*relu_output"], "regexes of ReLU output tensor names", optional=True)
    collection_names = Param(list, None, "extra collections of ReLU outputs")
    threshold_inactivity = Param(
        float, 1.0, "a node active in less than this percent of samples is dead", check=_percent
    )
    threshold_layer = Param(
        float,
        90.0,
        "fire when more than this percent of a layer's nodes are dead",
        check=_percent,
        documented_default=50.0,
    )
    patience = Param(
        int,
        1,
        "consecutive saved steps a layer must be over threshold_layer (trainguard)",
        check=lambda value: None if value >= 1 else "must be >= 1",
    )

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._streak: dict[str, int] = {}
        # calibrated: per layer, (active samples per node, samples) of the last `window` steps
        self._recent: dict[str, deque[tuple[np.ndarray, int]]] = {}

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
        certain = False
        non_finite: list[str] = []
        for name, value in read_values(trial, names, step).items():
            raw = np.asarray(value)
            # Real numbers compare with 0 the same in any precision: only complex values need
            # converting (to their magnitude) first.
            array = raw if raw.dtype.kind in "fiub" else as_float(value)
            if array is None or array.size == 0:
                continue
            if array.dtype.kind == "f" and not all_finite(trial, step, name, array):
                non_finite.append(name)  # NaN > 0 is False: a NaN layer is not dead, it diverged
                self._recent.pop(name, None)
                self.persistence.forget(name)
                continue
            nodes = activation_axes(array)
            dead_percent = self._dead_percent(name, nodes)
            if dead_percent is None:
                continue
            worst = max(worst, (dead_percent, name))
            over = dead_percent > self.threshold_layer
            self._streak[name] = self._streak.get(name, 0) + 1 if over else 0
            if self.single_step:
                if over and self._streak[name] >= self.patience:
                    fired[name] = dead_percent
                continue
            fire, sure = self.persisted(name, over)
            if fire and self._streak[name] >= self.patience:
                fired[name] = dead_percent
                certain = certain or sure
        if fired:
            name = max(fired, key=lambda key: fired[key])
            how_long = (
                f"for {self._streak[name]} saved step(s)"
                if self.single_step
                else f"over the samples of the last {len(self._recent[name])} saved step(s), "
                f"{self.persistence_text(name)}"
            )
            return self.issue(
                step,
                f"{fmt(fired[name])}% of the ReLUs in {name} are dead (active in < {fmt(self.threshold_inactivity)}% "
                f"of samples) {how_long}; threshold_layer {fmt(self.threshold_layer)}%",
                certain=certain,
                tensor=name,
                dead_percent=fired[name],
                layers=fired,
            )
        if non_finite:
            return self.no_issue(
                step,
                f"ReLU outputs hold non-finite values (ExplodingTensor's finding), not judged as dead: "
                f"{', '.join(sorted(non_finite))}",
                non_finite=sorted(non_finite),
            )
        if worst[1] == "":
            return None
        return self.no_issue(step, tensor=worst[1], max_dead_percent=worst[0])

    def _dead_percent(self, name: str, nodes: np.ndarray) -> float | None:
        """Percent of the layer's nodes active in < threshold_inactivity % of samples (calibrated:
        pooled over the samples of the last ``window`` saved steps)."""
        active = np.count_nonzero(nodes > 0, axis=0)
        samples = nodes.shape[0]
        if not self.single_step:
            recent = self._recent.get(name)
            if recent is None or (recent and recent[-1][0].shape != active.shape):
                recent = self._recent[name] = deque(maxlen=self.window)
            recent.append((active, samples))
            active = np.sum([counts for counts, _ in recent], axis=0)
            samples = sum(count for _, count in recent)
        if samples == 0 or active.size == 0:
            return None
        activity = 100.0 * active / samples
        return 100.0 * float(np.mean(activity < self.threshold_inactivity))


def select_any(rule: DeadRelu) -> bool:
    """Whether the run has any ReLU output at all (at any step)."""
    trial = rule.base_trial
    if "relu_output" in trial.collections() and trial.tensor_names(collection="relu_output"):
        return True
    return bool(trial.tensor_names(regex=rule.tensor_regex or []))
