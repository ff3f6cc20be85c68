"""OverallSystemUsage: statistics of every system metric; never fires.

For each node, metric name and dimension: the number of samples, min, max, mean, p50, p95 and p99
(numpy's linear percentiles) over everything recorded so far. Reported in the ``details`` of a
no-issue result on each scan with new data and at the end; the rule runner keeps the latest as the
rule's ``statistics``: in ``rule-output/OverallSystemUsage.json``, in the updates of ``rules run
--json`` and in the run's summary (:func:`render_statistics`: p50/p95/p99 per resource, the
machine's totals rather than each core).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore

__all__ = ["OverallSystemUsage", "render_statistics", "usage_statistics"]

_PER_CORE = re.compile(r"^cpu\d+$")  # cpu0, cpu1, ...: the summary shows the totals instead
_SHOWN = 12  # lines of statistics in a summary at most


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


def render_statistics(statistics: Mapping[str, Mapping[str, float]]) -> list[str]:
    """One line per resource (``node/name/dimension: p50 .., p95 .., p99 ..``), per-core CPU
    entries left out when the totals are there."""
    keys = sorted(statistics)
    parts = {key: (key.split("/", 2) + ["", ""])[1:3] for key in keys}  # node/name/dimension (I/OWait...)
    has_totals = any(dimension.startswith("Total") for _, dimension in parts.values())
    shown = [key for key in keys if not (has_totals and _PER_CORE.match(parts[key][0]))]
    lines = []
    for key in shown[:_SHOWN]:
        entry = statistics[key]
        try:
            p50, p95, p99 = (float(entry[name]) for name in ("p50", "p95", "p99"))
        except (KeyError, TypeError, ValueError):
            continue
        lines.append(f"{key}: p50 {p50:.4g}, p95 {p95:.4g}, p99 {p99:.4g} ({entry.get('samples', '?')} samples)")
    if len(shown) > _SHOWN:
        lines.append(f"... and {len(shown) - _SHOWN} more in rule-output/OverallSystemUsage.json")
    return lines
