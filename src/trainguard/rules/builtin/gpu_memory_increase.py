"""GPUMemoryIncrease: GPU memory use keeps growing (a leak, or tensors kept across steps).

Formula (SageMaker's), per node and GPU, on ``GPUMemoryUtilization`` values ``v`` (percent of
the GPU's memory): once ``len(v) > patience``, fire when

    mean(v[-window:]) - mean(v[-window-1:-2]) > increase      (percentage points)

trainguard evaluates this at every new sample (as if the series ended there), so the outcome
does not depend on how the data was split into scans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler import layout as L
from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore, positive

__all__ = ["GPUMemoryIncrease", "memory_increase"]


def memory_increase(values: np.ndarray, window: int) -> np.ndarray:
    """``mean(v[:i][-window:]) - mean(v[:i][-window-1:-2])`` for every end ``i`` in
    ``window+1 .. len(v)`` (earlier ends have windows of other sizes and are NaN)."""
    n = len(values)
    out = np.full(n + 1, np.nan)
    if n < window + 1 or window < 2:
        return out
    csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.arange(window + 1, n + 1)
    recent = (csum[ends] - csum[ends - window]) / window
    # v[:i][-window-1:-2] = v[i-window-1 : i-2], which holds window-1 values
    earlier = (csum[ends - 2] - csum[ends - window - 1]) / (window - 1)
    out[ends] = recent - earlier
    return out


class GPUMemoryIncrease(ProfilerRule):
    """The mean GPU memory use of the latest window jumped by more than ``increase`` points."""

    rule_name = "GPUMemoryIncrease"
    needs_gpu = True
    fix_hint = (
        "Look for tensors kept across steps (appending losses without .item()/.detach(), caches, "
        "growing lists of outputs) and for growing batch or sequence sizes; torch.cuda.memory_summary() "
        "shows what holds the memory."
    )
    increase = Param(float, 5.0, "jump of the mean memory use (percentage points) that fires", documented_default=10.0)
    patience = Param(int, 1000, "values per GPU needed before deciding", check=positive, documented_default=100)
    window = Param(int, 10, "size of the windows whose means are compared", documented_default=500,
                   check=lambda value: None if value >= 2 else "must be at least 2")  # fmt: skip

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.values = SeriesStore()
        self._checked: dict[tuple[str, str], int] = {}
        self.finding: dict[str, Any] | None = None

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        for record in records:
            if record.dimension == L.GPU_MEMORY_UTILIZATION:
                self.values.extend((record.node, record.name), [record.value])

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        if not self.values.keys():
            return None
        largest: dict[str, float] = {}
        for key in self.values.keys():
            values = self.values.get(key)
            start = max(self._checked.get(key, 0) + 1, self.patience + 1)  # new ends i, len > patience
            self._checked[key] = len(values)
            if len(values) < start:
                continue
            jumps = memory_increase(values, self.window)[start:]
            if jumps.size and np.isfinite(jumps).any():
                largest[f"{key[0]}/{key[1]}"] = round(float(np.nanmax(jumps)), 3)
            over = np.flatnonzero(jumps > self.increase)
            if over.size and self.finding is None:
                index = int(start + over[0])
                self.finding = {"node": key[0], "gpu": key[1], "sample": index, "increase": float(jumps[over[0]])}
        if self.finding is not None:
            f = self.finding
            return self.issue(
                self.last_step,
                f"memory use of {f['gpu']} on {f['node']} rose by {f['increase']:.1f} points (window {self.window}, "
                f"increase {self.increase:g}) at sample {f['sample']}",
                **f,
            )
        return self.no_issue(self.last_step, largest_increase=largest)
