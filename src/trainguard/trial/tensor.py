"""One tensor of a trial: its steps, values and reductions (smdebug's ``Tensor`` API)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from trainguard.config.reduction_config import reduction_tensor_name
from trainguard.errors import TensorUnavailableForStep
from trainguard.modes import ModeKeys
from trainguard.reductions import numpy_reduction

if TYPE_CHECKING:
    from trainguard.trial.trial import Trial
    from trainguard.trial.worker_view import WorkerTrial

__all__ = ["Tensor", "numpy_reduction"]


class Tensor:
    """Read-side view of one tensor name. Obtain it with ``trial.tensor(name)``."""

    def __init__(self, name: str, trial: Trial | WorkerTrial) -> None:
        self.name = name
        self._trial = trial

    def __repr__(self) -> str:
        return f"Tensor({self.name!r})"

    def steps(self, mode: ModeKeys = ModeKeys.GLOBAL, show_incomplete_steps: bool = False) -> list[int]:
        return self._trial._tensor_steps(self.name, mode, show_incomplete_steps)

    def workers(self, step: int, mode: ModeKeys = ModeKeys.GLOBAL) -> list[str]:
        return self._trial._tensor_workers(self.name, step, mode)

    def value(self, step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None) -> np.ndarray:
        return self._trial._read_values([self.name], step, mode, worker)[self.name]

    def saved_dtype(self, step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None) -> str:
        """The dtype the value was saved in: ``"bfloat16"`` for a bfloat16 tensor, whose
        :meth:`value` is float32 (numpy has no bfloat16; the widening is exact)."""
        from trainguard.format.tensor_codec import saved_dtype

        return saved_dtype(self.value(step, mode, worker))

    def values(self, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None) -> dict[int, np.ndarray]:
        return {step: self.value(step, mode, worker) for step in self.steps(mode)}

    def shape(self, step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None) -> tuple[int, ...]:
        shape = self._trial._saved_shape(self.name, step, mode, worker)
        return shape if shape is not None else tuple(self.value(step, mode, worker).shape)

    def reduction_value(
        self,
        step: int,
        reduction_name: str,
        mode: ModeKeys = ModeKeys.GLOBAL,
        worker: str | None = None,
        abs: bool = False,  # noqa: A002 - smdebug's parameter name
    ) -> np.ndarray:
        """A saved reduction, or one computed from the raw value when only that was saved."""
        base = reduction_name[: -len("_norm")] if reduction_name.endswith("_norm") else reduction_name
        saved_name = reduction_tensor_name(self.name, base, absolute=abs)
        if self._trial.has_tensor(saved_name):
            try:
                return self._trial.tensor(saved_name).value(step, mode, worker)
            except TensorUnavailableForStep:
                pass
        return numpy_reduction(self.value(step, mode, worker), base, abs)

    def reduction_values(
        self, step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None
    ) -> dict[tuple[str, bool], np.ndarray]:
        """Every reduction saved for this step, keyed by (name, absolute)."""
        found = {}
        prefix = "smdebug/reductions/"
        available = set(self._trial.tensor_names(show_prefixed_tensors=True, step=step, mode=mode))
        for name in sorted(self._trial._state.reductions_of.get(self.name, ())):
            if name in available:
                reduction = name[len(prefix) : -len(self.name) - 1]
                absolute = reduction.startswith("abs_")
                key = (reduction[4:] if absolute else reduction, absolute)
                found[key] = self._trial.tensor(name).value(step, mode, worker)
        return found

    def prev_steps(self, step: int, n: int, mode: ModeKeys = ModeKeys.GLOBAL) -> list[int]:
        """Up to ``n`` steps before ``step`` at which this tensor was saved (O(log steps + n))."""
        ordered = self._trial._shared_tensor_steps(self.name, mode)
        end = bisect.bisect_left(ordered, step)
        return list(ordered[max(0, end - n) : end]) if n > 0 else []
