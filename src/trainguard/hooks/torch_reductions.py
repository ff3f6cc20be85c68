"""Reductions (min, max, mean, std, norms...) of many torch tensors at once, fast and exact enough.

Measured on a 2-core x86 CPU, one torch thread, a 256x784 float32 weight:
- ``torch.aminmax`` takes 52 µs, numpy's ``min`` + ``max`` on the same memory 26 µs;
- the deviations' norm for ``std`` (a subtraction into a new tensor, then a norm) takes 57 µs,
  while the sum of squares is already at hand from ``l2`` or costs one ``dot`` (12 µs);
- torch's float32 CPU norms accumulate in float32: at 20 M elements ``vector_norm`` is off by
  1e-3 (``l2``) and 3e-2 (``l1``) relative. Large tensors are therefore reduced in chunks whose
  partial results add up in float64.

So, on the CPU: min/max by numpy, sum by ``torch.sum`` (cascade summation, accurate), the sum of
squares by chunked ``torch.dot`` (not numpy's: numpy's OpenBLAS runs threads of its own, which
ignore ``torch.set_num_threads``; a numpy dot of 1 M floats kept 1.46 cores busy here, taking
the training thread's core), and the variance from the first two moments wherever that is well
conditioned; where the mean dominates the spread (|mean| >> std, or a constant tensor) the
moments formula would cancel away every digit, and those tensors take two passes (the mean,
then the norm of the deviations). On other devices everything stays there, queued without a
host synchronisation: aminmax, and always two passes for the spread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# what torch._foreach_* take and return (lists in, tuples out)
_Tensors = list[torch.Tensor] | tuple[torch.Tensor, ...]

__all__ = ["as_float", "compute_reductions", "compute_reductions_many"]

# Elements per chunk of a float32 accumulation. torch.dot's error grows with the chunk: for 200k
# values near 1000 (a weight with a large offset) one dot was off by 1.1e-4 relative, chunks of
# 64k by 3e-5, chunks of 32k by 2e-7 (measured here, one thread); 32k-element chunks cost
# 0.77 ms per 4 M elements against 0.49 ms for 1 M-element chunks.
CHUNK = 1 << 15
# _Tensors up to this size share one multi-tensor norm kernel (its error is ~1e-6 there).
SMALL = 1 << 16
# The moments formula var = E[x^2] - mean^2 is used only where var >= 10 % of E[x^2]: its
# relative error is then at most ten times that of the sum of squares (~1e-6).
WELL_CONDITIONED = 0.9

Requested = tuple[tuple[str, bool], ...]


def as_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a float tensor the kernels accept (complex -> magnitude, ints -> float64)."""
    if x.is_complex():
        return x.abs()
    if not x.is_floating_point():
        return x.to(torch.float64)
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def compute_reductions(x: torch.Tensor, requested: Sequence[tuple[str, bool]]) -> torch.Tensor:
    """The requested reductions of ``x`` stacked into one float64 tensor on ``x``'s device."""
    return compute_reductions_many([as_float(x)], tuple(requested))[0]


def compute_reductions_many(tensors: list[torch.Tensor], requested: Requested) -> torch.Tensor:
    """Reductions of float tensors of one dtype and device: row ``i`` holds ``tensors[i]``'s.

    Population statistics (ddof=0), as numpy's defaults; norms are elementwise whatever the
    rank; ``zero_fraction`` is the share of exact zeros.
    """
    if tensors and tensors[0].device.type == "cpu":
        return torch.from_numpy(_ReductionTable(tensors, requested).table())
    return _on_device(tensors, requested)


class _ReductionTable:
    """The CPU path: one float64 numpy row per tensor; the heavy passes release the GIL."""

    def __init__(self, tensors: list[torch.Tensor], requested: Requested) -> None:
        self.tensors = [tensor.reshape(-1) for tensor in tensors]
        self.requested = requested
        self.sizes = np.array([tensor.numel() for tensor in self.tensors], dtype=np.float64)
        self._bases: dict[bool, _Tensors] = {False: self.tensors}
        self._columns: dict[tuple[str, bool], np.ndarray] = {}

    def table(self) -> np.ndarray:
        return np.stack([self._column(name, use_abs) for name, use_abs in self.requested], axis=1)

    def _base(self, use_abs: bool) -> _Tensors:
        if use_abs not in self._bases:
            self._bases[use_abs] = torch._foreach_abs(self.tensors)
        return self._bases[use_abs]

    def _column(self, name: str, use_abs: bool) -> np.ndarray:
        key = (name, use_abs)
        column = self._columns.get(key)
        if column is None:
            column = self._columns[key] = self._compute(name, use_abs)
        return column

    def _compute(self, name: str, use_abs: bool) -> np.ndarray:
        ys = self._base(use_abs)
        if name in ("min", "max"):
            minima, maxima = zip(*(_min_max(y) for y in ys), strict=True)
            self._columns[("min", use_abs)] = np.array(minima, dtype=np.float64)
            self._columns[("max", use_abs)] = np.array(maxima, dtype=np.float64)
            return self._columns[(name, use_abs)]
        if name == "sum":
            return np.array([float(y.sum()) for y in ys], dtype=np.float64)
        if name == "mean":
            return self._column("sum", use_abs) / self.sizes
        if name == "l2":
            return np.sqrt(self._column("\0sumsq", use_abs))
        if name == "\0sumsq":
            return _sums_of_squares(ys)
        if name == "l1":
            return np.array([float((y if use_abs else y.abs()).sum()) for y in ys], dtype=np.float64)
        if name == "variance":
            return self._variances(ys, use_abs)
        if name == "std":
            return np.sqrt(self._column("variance", use_abs))
        if name == "prod":
            return np.array([float(y.prod()) for y in ys], dtype=np.float64)
        if name == "zero_fraction":
            # 1 - nonzero/n: count_nonzero is twice as fast as (y == 0).sum()
            return 1.0 - np.array([int(torch.count_nonzero(y)) for y in ys], dtype=np.float64) / self.sizes
        raise ValueError(f"unknown reduction {name!r}")  # validated at configuration time

    def _variances(self, ys: _Tensors, use_abs: bool) -> np.ndarray:
        means = self._column("mean", use_abs)
        second_moments = self._column("\0sumsq", use_abs) / self.sizes
        squared_means = means * means
        with np.errstate(invalid="ignore"):  # NaN/inf tensors give NaN, as numpy's std does
            variances = np.maximum(second_moments - squared_means, 0.0)
            unstable = ~(squared_means <= WELL_CONDITIONED * second_moments)
        for index in np.flatnonzero(unstable):
            y, mean = ys[index], means[index]
            if not np.isfinite(mean):
                variances[index] = np.nan
                continue
            deviations = y - torch.tensor(mean, dtype=y.dtype)
            variances[index] = _sums_of_squares([deviations])[0] / self.sizes[index]
        return variances


def _min_max(y: torch.Tensor) -> tuple[float, float]:
    if y.dtype in (torch.float32, torch.float64) and y.is_contiguous():
        array = y.numpy()  # numpy's min/max are vectorised: twice as fast as torch.aminmax here
        return float(array.min()), float(array.max())
    low, high = torch.aminmax(y)
    return float(low), float(high)


def _sums_of_squares(ys: _Tensors) -> np.ndarray:
    """Sum of squares of each tensor, in float64 across chunks of float32 accumulation."""
    result = np.empty(len(ys), dtype=np.float64)
    small = [index for index, y in enumerate(ys) if y.numel() <= SMALL]
    if small:  # one multi-tensor kernel for all the small ones
        norms = torch._foreach_norm([ys[index] for index in small], 2)
        result[small] = np.square(torch.stack(norms).to(torch.float64).numpy())
    for index, y in enumerate(ys):
        if y.numel() > SMALL:
            y = y.contiguous()
            result[index] = sum(float(torch.dot(chunk, chunk)) for chunk in y.split(CHUNK))
    return result


def _on_device(tensors: list[torch.Tensor], requested: Requested) -> torch.Tensor:
    """Accelerator path: every value stays on the device, no host synchronisation."""
    columns: dict[tuple[str, bool], list[torch.Tensor]] = {}
    bases: dict[bool, _Tensors] = {False: tensors}
    for name, use_abs in requested:
        key = (name, use_abs)
        if key in columns:
            continue
        ys = bases.get(use_abs)
        if ys is None:
            ys = bases[use_abs] = torch._foreach_abs(tensors)
        if name in ("min", "max"):
            pairs = [torch.aminmax(y) for y in ys]  # one pass gives both
            columns[("min", use_abs)] = [pair[0] for pair in pairs]
            columns[("max", use_abs)] = [pair[1] for pair in pairs]
        elif name in ("mean", "std", "variance"):
            means = columns.get(("mean", use_abs))
            if means is None:
                means = columns[("mean", use_abs)] = [y.mean() for y in ys]
            if name != "mean":  # the deviations' norm; scaled by 1/sqrt(n) below
                columns[("std", use_abs)] = list(torch._foreach_norm(torch._foreach_sub(ys, means)))
        elif name in ("l1", "l2"):
            columns[key] = list(torch._foreach_norm(ys, 1 if name == "l1" else 2))
        elif name == "sum":
            columns[key] = [y.sum() for y in ys]
        elif name == "prod":
            columns[key] = [y.prod() for y in ys]
        elif name == "zero_fraction":
            columns[key] = [1.0 - torch.count_nonzero(y).to(y.dtype) / y.numel() for y in ys]
        else:
            raise ValueError(f"unknown reduction {name!r}")
    sources = list(dict.fromkeys(("std", key[1]) if key[0] == "variance" else key for key in requested))
    table = torch.stack([value for key in sources for value in columns[key]]).to(torch.float64)
    table = table.reshape(len(sources), len(tensors))
    rows = dict(zip(sources, table, strict=True))
    if any(key[0] == "std" for key in sources):
        scale = torch.tensor([tensor.numel() for tensor in tensors], dtype=torch.float64, device=table.device).rsqrt()
        for key in sources:
            if key[0] == "std":
                rows[key] = rows[key] * scale
    picked = [rows[("std", key[1])].square() if key[0] == "variance" else rows[key] for key in requested]
    return torch.stack(picked, dim=1)
