"""A run profiled by trainguard's own Profiler: the report plots what its readers return."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainguard.profiler import metric_series, read_step_timings, read_system_metrics
from trainguard.report import gather_report


def test_report_plots_the_profilers_system_metrics_and_step_times(profiled_run: Path) -> None:
    data = gather_report(profiled_run)
    metrics = read_system_metrics(profiled_run)
    timings = read_step_timings(profiled_run)
    assert metrics and timings
    charts = {chart.title: chart for chart in data.profiler.system_charts}
    assert {"CPU utilization", "Host memory used", "I/O wait", "Disk and network throughput"} <= set(charts)

    (cpu,) = metric_series(metrics, "TotalCPUUtilization").values()
    origin = min(metric.timestamp for metric in metrics)
    (shown,) = charts["CPU utilization"].series
    np.testing.assert_allclose(shown.x, cpu[0] - origin)
    np.testing.assert_allclose(shown.y, cpu[1])

    durations = {"TRAIN": [], "EVAL": []}
    for timing in sorted(timings, key=lambda t: t.step):
        durations[timing.mode].append((timing.step, timing.duration * 1000))
    step_chart = next(chart for chart in data.profiler.step_charts if chart.title == "Step duration")
    for series in step_chart.series:
        assert list(zip(series.x, series.y, strict=True)) == pytest.approx(durations[series.label])
    assert len(durations["TRAIN"]) == 20 and len(durations["EVAL"]) == 8

    breakdown = next(chart for chart in data.profiler.step_charts if chart.title == "TRAIN step time breakdown")
    forward = next(series for series in breakdown.series if series.label == "forward")
    train = sorted((t for t in timings if t.mode == "TRAIN"), key=lambda t: t.step)
    assert forward.y == pytest.approx([t.forward * 1000 for t in train])
    assert all(value > 0 for value in forward.y)
