"""UnchangedTensor: for each inspected tensor saved at step s, take its last ``num_steps`` saved steps
≤ s (including s, in s's mode); if that many exist and ``np.allclose(t_a, t_b, rtol, atol,
equal_nan)`` holds for every consecutive pair, fire.

SageMaker ``rule_to_invoke``: ``UnchangedTensor``; parameters ``collection_names``,
``tensor_regex``, ``num_steps`` (3), ``rtol`` (1e-5), ``atol`` (1e-8), ``equal_nan`` (False), as
documented. The look-back reaches steps before the evaluated range (the deleted SageMaker test:
tensors saved at 0, 1, 2 fire when only step 2 is evaluated).

Deviations: with neither ``collection_names`` nor ``tensor_regex`` (SageMaker: every tensor)
the parameters are inspected — collections ``weights``, ``biases``, ``gradients`` — since inputs,
labels and user scalars such as a constant learning rate legitimately repeat. Parameters
(``weights``/``biases`` members) are not judged at EVAL/PREDICT steps: weights do not change
while a model is evaluated. Tensors of differing shapes are "changed".

Calibrated semantics (default): the condition itself spans ``num_steps`` saved steps, so a
tensor fires at its first evaluation that holds (as SageMaker's) and is certain once it held at
``window`` consecutive evaluations. What is unchanged by construction is not judged: all-zero
gradients (their layer gets no signal in that batch or never: AllZero's and VanishingGradient's
findings), attention key biases (zero gradient: softmax is shift invariant), and parameters that
get no gradient: frozen (the run saved gradients but none for this parameter) or with an
all-zero gradient at every earlier saved step of its window (e.g. all-zero inputs in a batch of
size 1; or a mean |gradient| below 1e-7: a bias followed by BatchNorm), or none at all at those
steps while they saved other parameters' gradients (trained in another phase: layer-wise). When every parameter of
the model is unchanged, none is excused: nothing is learning. Unless ``rtol``/``atol`` are given,
calibrated semantics compare with rtol 1e-6 and no atol (``CALIBRATED_RTOL``).
Calibrated defaults inspect weights and biases only (a converged model's gradients legitimately
stay the same), and a tensor within ``atol`` of zero everywhere is not judged (that is
AllZero's or VanishingGradient's finding). ``semantics="sagemaker"``: SageMaker's condition at
every evaluated step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.base import StepResult
from trainguard.rules.builtin._helpers import (
    check_regexes,
    earlier_steps,
    is_complete,
    read_values,
    saved_at,
    select,
)
from trainguard.rules.builtin._persistence import Persistence, PersistentRule, is_key_bias
from trainguard.rules.params import Param

DEFAULT_COLLECTIONS = ("weights", "biases", "gradients")
CALIBRATED_COLLECTIONS = ("weights", "biases")
# Calibrated comparison: |a - b| <= 1e-6·|b|, no absolute tolerance. SageMaker's rtol 1e-5 and atol
# 1e-8 call a low-learning-rate fine-tune (and any weight near zero) unchanged; a learning rate
# too small to matter (1e-6 relative per step and below) is still found. Measured on the
# detection corpus: lr-tiny MLP/CNN/GRU faults found, low-lr fine-tune and BatchNorm CNN silent.
CALIBRATED_RTOL = 1e-6


class UnchangedTensor(PersistentRule):
    """Tensors that stay the same over several saved steps (nothing is being learned)."""

    rule_name = "UnchangedTensor"
    needs = "no weights, biases or gradients (or the selected tensors) were saved at num_steps steps of one mode"
    stop_policy = (
        "stops training when tensors stayed unchanged at every evaluation of a full window; SageMaker "
        "semantics never stop"
    )
    fix_hint = (
        "check that the learning rate is not 0, that the parameters are given to the optimizer and are "
        "trainable, and that the optimizer's step is called"
    )
    fix_hints = {
        "pytorch": (
            "check that the learning rate is not 0, that the parameters are passed to the optimizer with "
            "requires_grad=True, and that optimizer.step() is called"
        ),
        "keras": (
            "check that the learning rate is not 0, that the layers are trainable (layer.trainable=True) "
            "and that the model is compiled after changing trainable"
        ),
        "xgboost": "check that eta (learning_rate) is not 0 and that boosting rounds add trees",
    }

    collection_names = Param(list, None, "collections to inspect (default: weights, biases, gradients)")
    tensor_regex = Param(list, None, "regexes of tensor names to inspect")
    num_steps = Param(
        int, 3, "how many saved steps must be equal", check=lambda value: None if value >= 2 else "must be >= 2"
    )
    rtol = Param(float, 1e-5, "np.allclose rtol")
    atol = Param(float, 1e-8, "np.allclose atol")
    equal_nan = Param(bool, False, "NaN equals NaN")

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._values: dict[tuple[str, int], np.ndarray] = {}
        if self.calibrated:
            # the condition already spans num_steps saved steps: fire at once, certain over `window`
            self.persistence = Persistence(self.window, needed=1)
        # calibrated defaults compare relatively only (see CALIBRATED_RTOL)
        self._calibrated_tolerance = self.calibrated and "rtol" not in kwargs and "atol" not in kwargs

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def _names(self, step: int) -> list[str]:
        if self.collection_names or self.tensor_regex:
            return select(self, step, collections=self.collection_names, regex=self.tensor_regex)
        if self.calibrated:
            # whether the model learns is told by its parameters; a converged model's gradients
            # legitimately stay (near) the same
            return select(self, step, collections=CALIBRATED_COLLECTIONS)
        return select(self, step, collections=DEFAULT_COLLECTIONS)

    def _is_parameter(self, name: str) -> bool:
        trial = self.base_trial
        known = trial.collections()
        return any(c in known and trial.collection(c).matches(name) for c in ("weights", "biases"))

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        mode = trial.mode(step)
        names = self._names(step)
        if mode in (ModeKeys.EVAL, ModeKeys.PREDICT):
            names = [name for name in names if not self._is_parameter(name)]
        if not names:
            return None
        windows: dict[str, list[int]] = {}
        for name in names:
            before = earlier_steps(trial, name, step, lambda p: trial.mode(p) == mode, limit=self.num_steps - 1)
            same_mode = [*reversed(before), step]
            if len(same_mode) >= self.num_steps:
                windows[name] = same_mode[-self.num_steps :]
        if not windows:
            return self.no_issue(step, message=f"fewer than {self.num_steps} saved steps so far")
        needed: dict[int, list[str]] = {}
        for name, window in windows.items():
            for p in window:
                if (name, p) not in self._values:
                    needed.setdefault(p, []).append(name)
        for p, group in needed.items():
            for name, value in read_values(trial, group, p).items():
                self._values[(name, p)] = np.asarray(value)
        unchanged: dict[str, list[int]] = {}
        for name, window in windows.items():
            arrays = [array for p in window if (array := self._values.get((name, p))) is not None]
            if len(arrays) < len(window):
                continue
            if all(self._close(a, b) for a, b in zip(arrays, arrays[1:], strict=False)):
                unchanged[name] = window
        self._forget(windows)
        excused = self._unchanged_by_construction(step, windows, unchanged) if self.calibrated else set()
        fired: dict[str, list[int]] = {}
        certain = False
        for name in windows:
            if name in excused:
                self.persistence.forget(name)
                continue
            fire, sure = self.persisted(name, name in unchanged)
            if fire:
                fired[name] = unchanged[name]
                certain = certain or sure
        if fired:
            name = sorted(fired)[0]
            return self.issue(
                step,
                f"{len(fired)} tensor(s) did not change over their last {self.num_steps} saved steps "
                f"{self.persistence_text(name)}, e.g. {name} at steps {fired[name]}",
                certain=certain,
                tensor=name,
                steps=fired[name],
                tensors=sorted(fired),
                not_judged=sorted(excused),
            )
        return self.no_issue(step, tensors_checked=len(windows), not_judged=sorted(excused))

    def _unchanged_by_construction(
        self, step: int, windows: dict[str, list[int]], unchanged: dict[str, list[int]]
    ) -> set[str]:
        """Unchanged tensors that get no gradient by construction (see the module docstring)."""
        trial = self.base_trial
        excused = {name for name in unchanged if is_key_bias(name)}
        for name in unchanged:  # within atol of zero: "unchanged" says only "(near) zero"
            value = self._values.get((name, step))
            if value is not None and value.dtype.kind in "fciub" and np.all(np.abs(value) <= self.atol):
                excused.add(name)
        gradients = unchanged.keys() & {name for name in windows if name.startswith("gradient/")}
        for name in gradients:
            value = self._values.get((name, step))
            if value is not None and value.dtype.kind in "fciub" and not np.any(value):
                excused.add(name)
        parameters = [name for name in windows if self._is_parameter(name)]
        if not parameters or all(name in unchanged for name in parameters):
            return excused  # nothing in the model changes: no parameter is excused
        saved = set(trial.tensor_names(collection="gradients")) if "gradients" in trial.collections() else set()
        if not saved:
            return excused  # the run saved no gradients: frozen cannot be told from not updated
        candidates = [name for name in parameters if name in unchanged and name not in excused]
        present = {name: f"gradient/{name}" for name in candidates if f"gradient/{name}" in saved}
        for name in candidates:
            if name not in present:
                excused.add(name)  # frozen: no gradient ever saved
        # A weight unchanged from saved step a to b got zero updates in between. If its gradient at
        # the window's earlier saved steps was all zero (no signal: all-zero inputs, unused), that
        # is by construction; a non-zero gradient that was never applied is the fault (lr 0, not
        # given to the optimizer).
        # A weight that got no gradient at all at those steps while they saved other weights'
        # gradients was not being trained then (a forward-forward net trains layer by layer).
        earlier = sorted({p for name in present for p in windows[name][:-1]})
        zero: dict[str, list[bool]] = {name: [] for name in present}
        for p in earlier:
            wanted = [present[name] for name in present if p in windows[name][:-1]]
            values = read_values(trial, wanted, p)
            saved_here = {gradient for gradient in saved if saved_at(trial, gradient, p)}
            for gradient in wanted:
                if gradient in values:
                    zero[gradient.removeprefix("gradient/")].append(_no_signal(values[gradient]))
                elif saved_here - {gradient}:
                    zero[gradient.removeprefix("gradient/")].append(True)  # none: not trained here
        for name, flags in zero.items():
            if flags and all(flags):
                excused.add(name)
        return excused

    def _close(self, a: np.ndarray, b: np.ndarray) -> bool:
        if a.shape != b.shape:
            return False
        if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
            return bool(np.array_equal(a, b))
        if self._calibrated_tolerance:
            return bool(np.allclose(a, b, rtol=CALIBRATED_RTOL, atol=0.0, equal_nan=self.equal_nan))
        return bool(np.allclose(a, b, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan))

    def _forget(self, windows: dict[str, list[int]]) -> None:
        """Keep only values still inside some window: memory stays ~num_steps values per tensor."""
        keep = {(name, p) for name, window in windows.items() for p in window}
        for key in [key for key in self._values if key[0] in windows and key not in keep]:
            del self._values[key]


# a gradient this small (mean |g|, VanishingGradient's default threshold) carries no signal: an
# unchanged weight under it is zero by construction (a bias before BatchNorm, an attention key
# bias) or VanishingGradient's finding, not a weight the optimizer fails to update
NO_SIGNAL = 1e-7


def _no_signal(value: Any) -> bool:
    array = np.asarray(value)
    if array.dtype.kind not in "fciub" or array.size == 0:
        return False
    with np.errstate(all="ignore"):
        return bool(np.mean(np.abs(array.astype(np.float64))) < NO_SIGNAL)
