"""LoadBalancing: some GPUs work much more than others (uneven data or model parallelism).

Formula (SageMaker's), once every GPU has more than ``patience`` utilization values: per GPU a
normalised histogram of ``GPUUtilization`` over the bins ``0, 2, 4, ..., 100``; fire when the
Jensen-Shannon distance (natural log, as ``scipy.spatial.distance.jensenshannon``) between the
histograms of any two GPUs exceeds ``threshold``. trainguard's bins include 100 % (SageMaker's
``np.arange(0, 100, 2)`` edges dropped values above 98 %).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

from trainguard.profiler import layout as L
from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore, positive

__all__ = ["LoadBalancing", "jensen_shannon_distance"]

BIN_EDGES = np.arange(0, 102, 2)


def jensen_shannon_distance(p: np.ndarray, q: np.ndarray) -> float:
    """sqrt of the Jensen-Shannon divergence (natural log) of two histograms (normalised here)."""
    p = np.asarray(p, dtype=np.float64) / np.sum(p)
    q = np.asarray(q, dtype=np.float64) / np.sum(q)
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        mask = a > 0
        return float(np.sum(a[mask] * np.log(a[mask] / b[mask])))

    return float(np.sqrt(max(0.0, (kl(p, m) + kl(q, m)) / 2)))


class LoadBalancing(ProfilerRule):
    """The utilization distributions of two GPUs differ by more than ``threshold``."""

    rule_name = "LoadBalancing"
    needs_gpu = True
    fix_hint = (
        "Balance the work across GPUs: use DistributedDataParallel (one process per GPU) instead of "
        "DataParallel, shard data evenly (DistributedSampler, drop_last), and balance pipeline stages."
    )
    threshold = Param(float, 0.5, "Jensen-Shannon distance between two GPUs' histograms that fires")
    patience = Param(int, 1000, "values per GPU needed before deciding", check=positive, documented_default=10)

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.values = SeriesStore()

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        for record in records:
            if record.dimension == L.GPU_UTILIZATION:
                self.values.extend((record.node, record.name), [record.value])

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        keys = self.values.keys()
        if len(keys) < 2:
            return None
        series = {key: self.values.get(key) for key in keys}
        if any(len(values) <= self.patience for values in series.values()):
            return None
        histograms = {key: np.histogram(values, bins=BIN_EDGES)[0] for key, values in series.items()}
        distances = {}
        worst: tuple[float, Any, Any] = (-1.0, None, None)
        for a, b in combinations(keys, 2):
            distance = jensen_shannon_distance(histograms[a], histograms[b])
            distances[f"{a[0]}/{a[1]}~{b[0]}/{b[1]}"] = round(distance, 4)
            worst = max(worst, (distance, a, b), key=lambda item: item[0])
        distance, a, b = worst
        if distance > self.threshold:
            return self.issue(
                self.last_step,
                f"the utilization of {a[1]} on {a[0]} and {b[1]} on {b[0]} differ: Jensen-Shannon distance "
                f"{distance:.3f} > threshold {self.threshold:g}",
                distances=distances,
            )
        return self.no_issue(self.last_step, distances=distances)
