"""VanishingGradient: ``fire at step s if ∃ g ∈ gradients: mean(|g_s|) < threshold``.

SageMaker ``rule_to_invoke``: ``VanishingGradient``; parameter ``threshold`` (default 1e-7,
as documented). Gradients are the ``gradients`` collection (PyTorch ``gradient/<param>``).
Non-finite gradients are ExplodingTensor's finding and are skipped here; empty tensors too.
"""

from __future__ import annotations

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._helpers import all_finite, as_float, fmt, is_complete, read_values, select
from trainguard.rules.builtin._parallel import map_tensors
from trainguard.rules.params import Param


class VanishingGradient(Rule):
    """Gradients so small that the layers they reach stop learning."""

    rule_name = "VanishingGradient"
    collections = ("gradients",)
    fix_hint = (
        "use ReLU/LeakyReLU instead of sigmoid/tanh in deep stacks, add BatchNorm or residual "
        "connections, and use Xavier/He initialisation (torch.nn.init.kaiming_normal_)"
    )

    threshold = Param(
        float,
        1e-7,
        "fire when the mean absolute value of a gradient is below this",
        check=lambda value: None if value >= 0 else "must be >= 0",
    )

    def _mean_abs(self, step: int, name: str, value: np.ndarray) -> float | None:
        """mean(|g|) in float64; None for empty, non-finite or non-numeric gradients."""
        raw = np.asarray(value)
        if raw.dtype.kind == "f":
            if raw.size == 0 or not all_finite(self.base_trial, step, name, raw):
                return None
            # |x| is exact in any float precision: abs written straight into float64 gives
            # the very values widening first did, in one pass instead of two
            return float(np.mean(np.abs(raw, out=np.empty(raw.shape, dtype=np.float64))))
        array = as_float(value)
        if array is None or array.size == 0 or not np.all(np.isfinite(array)):
            return None
        return float(np.mean(np.abs(array)))

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
        smallest: tuple[float, str] | None = None
        vanished: list[tuple[str, float]] = []
        values = read_values(trial, names, step)
        for name, mean_abs in map_tensors(lambda name, value: self._mean_abs(step, name, value), values).items():
            if mean_abs is None:
                continue
            if smallest is None or mean_abs < smallest[0]:
                smallest = (mean_abs, name)
            if mean_abs < self.threshold:
                vanished.append((name, mean_abs))
        if smallest is None:
            return None
        if vanished:
            name, value = min(vanished, key=lambda item: item[1])
            return self.issue(
                step,
                f"{len(vanished)} gradient(s) vanished: mean |{name}| = {fmt(value)} < threshold {fmt(self.threshold)}",
                tensor=name,
                mean_abs=value,
                threshold=self.threshold,
                vanished={key: val for key, val in vanished},
            )
        return self.no_issue(step, tensor=smallest[1], min_mean_abs=smallest[0])
