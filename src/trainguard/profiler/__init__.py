"""Profiling a training job: system metrics and per-step framework timings, in SageMaker's layouts.

    from trainguard.profiler import Profiler, read_step_timings, read_system_metrics

    with Profiler("runs/job1", interval_ms=500):      # or profiler.start() ... profiler.stop()
        train()
    steps = read_step_timings("runs/job1")            # list[StepTiming]
    metrics = read_system_metrics("runs/job1")        # list[SystemMetric]

Files land in ``<run>/profiler-output/`` (see :mod:`trainguard.profiler.layout`); the profiler
rules (``CPUBottleneck``, ``StepOutlier``, ...) and the HTML report read them with the readers
here. Zero-code: ``TRAINGUARD_PROFILER=1 trainguard run -- python train.py``.
"""

from __future__ import annotations

from trainguard.profiler.core import MIN_INTERVAL_MS, Profiler, start_from_environment
from trainguard.profiler.reader import (
    StepTiming,
    StepTimingReader,
    SystemMetric,
    SystemMetricsReader,
    locate_profiler_output,
    metric_series,
    read_step_timings,
    read_system_metrics,
)

__all__ = [
    "MIN_INTERVAL_MS",
    "Profiler",
    "StepTiming",
    "StepTimingReader",
    "SystemMetric",
    "SystemMetricsReader",
    "locate_profiler_output",
    "metric_series",
    "read_step_timings",
    "read_system_metrics",
    "start_from_environment",
]
