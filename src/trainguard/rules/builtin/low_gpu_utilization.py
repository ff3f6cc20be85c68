"""LowGPUUtilization: a GPU is mostly idle, or swings between busy and idle.

Formula (SageMaker's), per node and GPU, on ``GPUUtilization`` values ``v``: once
``len(v) > patience``, on the last ``window`` values ``w``:

* under-utilized: ``p95(w) < threshold_p95``;
* fluctuating: ``p95(w) > threshold_p95`` and ``p5(w) < threshold_p5``.

Evaluated whenever new samples arrived (percentiles are numpy's linear interpolation).
Without GPU records the rule has nothing to evaluate and never fires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler import layout as L
from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore, percent, positive

__all__ = ["LowGPUUtilization"]


def _group(records: Sequence[SystemMetric], dimension: str) -> dict[tuple[str, str], list[float]]:
    grouped: dict[tuple[str, str], list[float]] = {}
    for record in records:
        if record.dimension == dimension:
            grouped.setdefault((record.node, record.name), []).append(record.value)
    return grouped


class LowGPUUtilization(ProfilerRule):
    """A GPU is under-used (low p95) or fluctuates (high p95, low p5)."""

    rule_name = "LowGPUUtilization"
    needs_gpu = True
    fix_hint = (
        "Under-used GPU: increase the batch size, feed data faster (DataLoader num_workers, "
        "pin_memory), or use a smaller instance. Fluctuating GPU: look for blocking work between "
        "steps (data loading, logging, checkpoints, host-device copies)."
    )
    threshold_p95 = Param(float, 70.0, "p95 of utilization (%) below this: under-utilized", check=percent)
    threshold_p5 = Param(float, 10.0, "p5 of utilization (%) below this (with a high p95): fluctuating", check=percent)
    window = Param(int, 500, "number of most recent values the percentiles are taken over", check=positive)
    patience = Param(int, 1000, "values per GPU needed before deciding", check=positive)

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.values = SeriesStore()

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        for key, values in _group(records, L.GPU_UTILIZATION).items():
            self.values.extend(key, values)

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        findings: list[dict[str, Any]] = []
        stats = {}
        for node, gpu in self.values.keys():
            values = self.values.get((node, gpu))
            if len(values) <= self.patience:
                continue
            recent = values[-self.window :]
            p95, p5 = (float(x) for x in np.percentile(recent, [95, 5]))
            stats[f"{node}/{gpu}"] = {"p95": round(p95, 2), "p5": round(p5, 2), "values": int(len(values))}
            if p95 < self.threshold_p95:
                findings.append({"node": node, "gpu": gpu, "kind": "under-utilized", "p95": p95, "p5": p5})
            elif p5 < self.threshold_p5:
                findings.append({"node": node, "gpu": gpu, "kind": "fluctuating", "p95": p95, "p5": p5})
        if not self.values.keys():
            return None
        if findings:
            first = findings[0]
            return self.issue(
                self.last_step,
                f"{first['gpu']} on {first['node']} is {first['kind']}: p95 {first['p95']:.1f}%, p5 {first['p5']:.1f}% "
                f"over its last {self.window} samples (threshold_p95 {self.threshold_p95:g}, "
                f"threshold_p5 {self.threshold_p5:g})",
                findings=findings,
                gpus=stats,
            )
        return self.no_issue(self.last_step, gpus=stats)
