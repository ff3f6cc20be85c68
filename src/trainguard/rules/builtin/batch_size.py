"""BatchSize: CPU and a GPU are both under-used, so the batch could be larger.

Formula (SageMaker's), per node, on the last ``window`` samples once more than ``patience``
samples were seen: fire when ``p95(total CPU) < cpu_threshold_p95`` and, for some GPU,
``p95(GPUUtilization) < gpu_threshold_p95`` and ``p95(GPUMemoryUtilization) <
gpu_memory_threshold_p95``. Total CPU is trainguard's ``TotalCPUUtilization`` record, or, in
SageMaker's files, the mean over the cores of each sample.

CPU-only machines: without GPU records the GPU half of the condition cannot hold: never fires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler import layout as L
from trainguard.profiler.reader import SystemMetric
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore, SnapshotGrouper, percent, positive

__all__ = ["BatchSize"]


class BatchSize(ProfilerRule):
    """CPU, GPU and GPU memory all under-used: the batch size is probably too small."""

    rule_name = "BatchSize"
    fix_hint = (
        "Increase the batch size (scale the learning rate with it), or train on a smaller/cheaper "
        "instance; check that the data pipeline can feed the larger batches."
    )
    cpu_threshold_p95 = Param(float, 70.0, "p95 of total CPU utilization (%) below this counts as low", check=percent)
    gpu_threshold_p95 = Param(float, 70.0, "p95 of GPU utilization (%) below this counts as low", check=percent)
    gpu_memory_threshold_p95 = Param(float, 70.0, "p95 of GPU memory use (%) below this counts as low", check=percent)
    patience = Param(int, 1000, "samples per node needed before deciding", check=positive, documented_default=100)
    window = Param(int, 500, "number of most recent samples the percentiles are taken over", check=positive)

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self._grouper = SnapshotGrouper()
        self.cpu = SeriesStore()  # node -> total CPU per sample
        self.gpu = SeriesStore()  # (node, gpu, dimension) -> values

    def _take(self, snapshots: Sequence[list[SystemMetric]]) -> None:
        for snapshot in snapshots:
            node = snapshot[0].node
            totals = [r.value for r in snapshot if r.dimension == L.TOTAL_CPU_UTILIZATION]
            cores = [r.value for r in snapshot if r.dimension == L.CPU_UTILIZATION]
            if totals or cores:
                self.cpu.extend(node, [totals[0] if totals else float(np.mean(cores))])
            for r in snapshot:
                if r.dimension in (L.GPU_UTILIZATION, L.GPU_MEMORY_UTILIZATION):
                    self.gpu.extend((node, r.name, r.dimension), [r.value])

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        self._take(self._grouper.add(records))

    def on_finish(self) -> None:
        self._take(self._grouper.flush())

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        nodes = self.cpu.keys()
        if not nodes:
            return None
        stats: dict[str, Any] = {}
        for node in nodes:
            cpu = self.cpu.get(node)
            if len(cpu) <= self.patience:
                continue
            cpu_p95 = float(np.percentile(cpu[-self.window :], 95))
            stats[node] = {"cpu_p95": round(cpu_p95, 2)}
            gpus = sorted({key[1] for key in self.gpu.keys() if key[0] == node})
            for gpu in gpus:
                util = self.gpu.get((node, gpu, L.GPU_UTILIZATION))
                memory = self.gpu.get((node, gpu, L.GPU_MEMORY_UTILIZATION))
                if not len(util) or not len(memory):
                    continue
                util_p95 = float(np.percentile(util[-self.window :], 95))
                memory_p95 = float(np.percentile(memory[-self.window :], 95))
                stats[node][gpu] = {"gpu_p95": round(util_p95, 2), "memory_p95": round(memory_p95, 2)}
                if (
                    cpu_p95 < self.cpu_threshold_p95
                    and util_p95 < self.gpu_threshold_p95
                    and memory_p95 < self.gpu_memory_threshold_p95
                ):
                    return self.issue(
                        self.last_step,
                        f"on {node}, p95 of CPU {cpu_p95:.1f}%, of {gpu} utilization {util_p95:.1f}% and of its memory "
                        f"{memory_p95:.1f}% are all below their thresholds ({self.cpu_threshold_p95:g}, "
                        f"{self.gpu_threshold_p95:g}, {self.gpu_memory_threshold_p95:g}) "
                        f"over the last {self.window} samples",
                        node=node, gpu=gpu, stats=stats,
                    )  # fmt: skip
        return self.no_issue(self.last_step, stats=stats)
