"""OverallSystemUsage: statistics of every system metric; never fires.

For each node, metric name and dimension: the number of samples, min, max, mean, p50, p95 and p99
(numpy's linear percentiles) over everything recorded so far. Reported in the ``details`` of a
no-issue result on each scan with new data and at the end, for reports and dashboards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore

__all__ = ["OverallSystemUsage", "usage_statistics"]


def usage_statistics(values: np.ndarray) -> dict[str, float]:
    p50, p95, p99 = (float(x) for x in np.percentile(values, [50, 95, 99]))
    return {
        "samples": int(values.size), "min": float(values.min()), "max": float(values.max()),
        "mean": float(values.mean()), "p50": p50, "p95": p95, "p99": p99,
    }  # fmt: skip


class OverallSystemUsage(ProfilerRule):
    """Usage statistics per node and metric (CPU, GPU, memory, I/O); informational only."""

    rule_name = "OverallSystemUsage"
    fix_hint = ""

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.values = SeriesStore()

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        grouped: dict[tuple[str, str, str], list[float]] = {}
        for record in records:
            grouped.setdefault((record.node, record.name, record.dimension), []).append(record.value)
        for key, values in grouped.items():
            self.values.extend(key, values)

    def statistics(self) -> dict[str, dict[str, float]]:
        return {f"{node}/{name}/{dimension}": usage_statistics(self.values.get((node, name, dimension)))
                for node, name, dimension in self.values.keys()}  # fmt: skip

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        if not self.values.keys():
            return None
        return self.no_issue(self.last_step, "statistics only", statistics=self.statistics())
