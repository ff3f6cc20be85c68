"""A trial seen from one worker: every read that does not name a worker reads that worker's data.

The rule runner evaluates tensor rules once per worker (a NaN loss on rank 1 of a DDP job is a
finding even when rank 0 looks healthy). Rules are written against a plain trial and read
``trial.tensor(name).value(step)`` or ``trial.tensor_values(names, step)`` without a worker,
which on a plain trial means "the first worker". Handing each rule instance a
:class:`WorkerTrial` instead makes those same calls read the bound worker, so no rule has to know
about workers at all.

Everything else (steps, modes, collections, tensor names, completeness, the run's listing in
``_state``) is the run's and is delegated unchanged: a step is complete when every worker wrote
it, whichever worker a rule looks at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.modes import ModeKeys
from trainguard.trial.tensor import Tensor

__all__ = ["WorkerTrial"]


class WorkerTrial:
    """``trial`` with reads defaulting to ``worker`` (e.g. ``"worker_1"``)."""

    def __init__(self, trial: Any, worker: str) -> None:
        # set through __dict__: __getattr__ must never see these missing
        self.__dict__["_trial"] = trial
        self.__dict__["bound_worker"] = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._trial, name, value)

    def __repr__(self) -> str:
        return f"WorkerTrial({self._trial!r}, {self.bound_worker!r})"

    @property
    def base(self) -> Any:
        """The whole run's trial."""
        return self._trial

    # -- reads bound to the worker -----------------------------------------------------------
    def tensor(self, name: str) -> Tensor:
        self._trial.tensor(name)  # same errors for a tensor the run never saved
        return Tensor(name, self)

    def tensor_values(
        self, names: Sequence[str], step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None
    ) -> dict[str, np.ndarray]:
        return self._read_values(list(names), step, mode, worker)

    def _read_values(self, names: list[str], step: int, mode: Any, worker: str | None) -> dict[str, np.ndarray]:
        return self._trial._read_values(names, step, mode, worker or self.bound_worker)

    def _saved_shape(self, name: str, step: int, mode: ModeKeys, worker: str | None) -> tuple[int, ...] | None:
        return self._trial._saved_shape(name, step, mode, worker or self.bound_worker)
