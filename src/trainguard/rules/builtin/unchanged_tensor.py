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
"""

from __future__ import annotations

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._helpers import check_regexes, earlier_steps, is_complete, read_values, select
from trainguard.rules.params import Param

DEFAULT_COLLECTIONS = ("weights", "biases", "gradients")


class UnchangedTensor(Rule):
    """Tensors that stay the same over several saved steps (nothing is being learned)."""

    rule_name = "UnchangedTensor"
    fix_hint = (
        "check that the learning rate is not 0, that the parameters are passed to the optimizer with "
        "requires_grad=True, and that optimizer.step() is called"
    )

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

    def validate(self) -> None:
        check_regexes(self, "tensor_regex")

    def _names(self, step: int) -> list[str]:
        if self.collection_names or self.tensor_regex:
            return select(self, step, collections=self.collection_names, regex=self.tensor_regex)
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
            arrays = [self._values.get((name, p)) for p in window]
            if any(array is None for array in arrays):
                continue
            if all(self._close(a, b) for a, b in zip(arrays, arrays[1:], strict=False)):
                unchanged[name] = window
        self._forget(windows)
        if unchanged:
            name = sorted(unchanged)[0]
            return self.issue(
                step,
                f"{len(unchanged)} tensor(s) did not change over their last {self.num_steps} saved steps, "
                f"e.g. {name} at steps {unchanged[name]}",
                tensor=name,
                steps=unchanged[name],
                tensors=sorted(unchanged),
            )
        return self.no_issue(step, tensors_checked=len(windows))

    def _close(self, a: np.ndarray, b: np.ndarray) -> bool:
        if a.shape != b.shape:
            return False
        if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
            return bool(np.array_equal(a, b))
        return bool(np.allclose(a, b, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan))

    def _forget(self, windows: dict[str, list[int]]) -> None:
        """Keep only values still inside some window: memory stays ~num_steps values per tensor."""
        keep = {(name, p) for name, window in windows.items() for p in window}
        for key in [key for key in self._values if key[0] in windows and key not in keep]:
            del self._values[key]
