"""Reductions computed with numpy: the reference definitions, used by the reader (a reduction
asked for but only the raw tensor saved) and by the hook for CPU tensors (computed on the
writer thread from a snapshot, so the training thread pays one copy instead of many ops).

Norms are elementwise for every rank (``l2`` = sqrt of the sum of squares of all elements);
``std``/``variance`` are population statistics (ddof=0); everything is computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["numpy_reduction", "reduce_array"]


def _l2(y: np.ndarray) -> np.floating:
    # Not np.dot: that calls BLAS, whose worker threads would compete with training for cores.
    return np.sqrt(np.sum(np.square(np.abs(y))))


_OPERATIONS: dict[str, Callable[[np.ndarray], Any]] = {
    "min": np.min, "max": np.max, "mean": np.mean, "std": np.std, "variance": np.var,
    "sum": np.sum, "prod": np.prod,
    "l1": lambda y: np.sum(np.abs(y)),
    "l2": _l2,
    "zero_fraction": lambda y: np.count_nonzero(y == 0) / y.size,
}  # fmt: skip


def _prepare(value: np.ndarray) -> np.ndarray:
    x = np.asarray(value)
    if x.dtype.kind == "c":
        return np.abs(x).astype(np.float64)
    return x.astype(np.float64) if x.dtype.kind in "biuf" and x.dtype != np.float64 else x


def numpy_reduction(value: np.ndarray, reduction: str, absolute: bool = False) -> np.ndarray:
    """One reduction of ``value`` as a 0-d float64 array."""
    name = reduction[: -len("_norm")] if reduction.endswith("_norm") else reduction
    if name not in _OPERATIONS:
        raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_OPERATIONS)}")
    x = _prepare(value)
    return np.array(_OPERATIONS[name](np.abs(x) if absolute else x), dtype=np.float64)


def reduce_array(value: np.ndarray, requested: Sequence[tuple[str, bool]]) -> np.ndarray:
    """Several reductions as one float64 vector (NaN for an empty tensor)."""
    x = _prepare(value)
    if x.size == 0:
        return np.full(len(requested), np.nan)
    absolute: np.ndarray | None = None  # |x|, computed once, on the first reduction that needs it
    out = np.empty(len(requested), dtype=np.float64)
    for position, (name, use_abs) in enumerate(requested):
        operand = x
        if use_abs:
            if absolute is None:
                absolute = np.abs(x)
            operand = absolute
        out[position] = _OPERATIONS[name](operand)
    return out
