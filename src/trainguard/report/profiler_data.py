"""The profiler side of a report: system-metric and step-time charts from ``<run>/profiler-output``.

Reads with :mod:`trainguard.profiler`'s readers through a :class:`Store`, so local and ``s3://``
runs read the same way. Unreadable lines and files become notes in the report, not errors.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from trainguard.errors import StorageError
from trainguard.profiler import StepTiming, StepTimingReader, SystemMetric, SystemMetricsReader, layout
from trainguard.report.charts import Chart, Series
from trainguard.storage.base import Store

__all__ = ["ProfilerSections", "gather_profiler_sections"]

PROFILER_PREFIX = layout.PROFILER_DIR + "/"


@dataclass
class ProfilerSections:
    system_charts: list[Chart] = field(default_factory=list)
    step_charts: list[Chart] = field(default_factory=list)
    step_stats: list[dict[str, object]] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def note(self, section: str, text: str) -> None:
        self.notes.setdefault(section, []).append(text)


def _mean_per_timestamp(records: list[SystemMetric], scale: float) -> tuple[list[float], list[float]]:
    grouped: dict[float, list[float]] = defaultdict(list)
    for record in records:
        grouped[record.timestamp].append(record.value * scale)
    times = sorted(grouped)
    return times, [float(np.mean(grouped[t])) for t in times]


def _system_charts(records: list[SystemMetric]) -> list[Chart]:
    if not records:
        return []
    origin = min(record.timestamp for record in records)
    by_dimension: dict[str, list[SystemMetric]] = defaultdict(list)
    for record in records:
        by_dimension[record.dimension].append(record)

    def per_node(selected: list[SystemMetric], label: str, scale: float = 1.0) -> list[Series]:
        """One series per node, averaging the per-core (or per-device) values of each sample."""
        nodes: dict[str, list[SystemMetric]] = defaultdict(list)
        for record in selected:
            nodes[record.node or "node"].append(record)
        series = []
        for node, items in sorted(nodes.items()):
            times, values = _mean_per_timestamp(items, scale)
            name = label if len(nodes) == 1 else f"{node} {label}"
            series.append(Series(name, [t - origin for t in times], values))
        return series

    def per_device(selected: list[SystemMetric]) -> list[Series]:
        devices: dict[tuple[str, str], list[SystemMetric]] = defaultdict(list)
        for record in selected:
            devices[(record.node or "node", record.name)].append(record)
        nodes = {node for node, _ in devices}
        series = []
        for (node, name), items in sorted(devices.items()):
            items.sort(key=lambda r: r.timestamp)
            label = name if len(nodes) == 1 else f"{node} {name}"
            series.append(Series(label, [r.timestamp - origin for r in items], [r.value for r in items]))
        return series

    charts = []
    x_label = "seconds since profiling started"
    cpu = by_dimension.get(layout.TOTAL_CPU_UTILIZATION) or by_dimension.get(layout.CPU_UTILIZATION, [])
    charts.append(Chart("CPU utilization", x_label, "% busy (all cores)", per_node(cpu, "CPU")))
    memory = [r for r in records if r.name == "MemoryUsedPercent"]
    charts.append(Chart("Host memory used", x_label, "% of memory", per_node(memory, "memory")))
    for dimension, title in (
        (layout.GPU_UTILIZATION, "GPU utilization"),
        (layout.GPU_MEMORY_UTILIZATION, "GPU memory used"),
    ):
        if by_dimension.get(dimension):
            charts.append(Chart(title, x_label, "%", per_device(by_dimension[dimension])))
    io_wait = by_dimension.get(layout.TOTAL_IO_WAIT) or by_dimension.get(layout.IO_WAIT, [])
    charts.append(Chart("I/O wait", x_label, "% of CPU time", per_node(io_wait, "I/O wait")))
    throughput = []
    for dimension, label in (
        (layout.DISK_READ, "disk read"), (layout.DISK_WRITE, "disk write"),
        (layout.NET_RECEIVE, "network receive"), (layout.NET_TRANSMIT, "network transmit"),
    ):  # fmt: skip
        throughput += per_node(by_dimension.get(dimension, []), label, scale=1 / 2**20)
    if throughput:
        charts.append(Chart("Disk and network throughput", x_label, "MiB/s", throughput))
    return charts


def _step_charts(timings: list[StepTiming]) -> tuple[list[Chart], list[dict[str, object]]]:
    if not timings:
        return [], []
    groups: dict[tuple[str, int, str], list[StepTiming]] = defaultdict(list)
    for timing in timings:
        groups[(timing.mode, timing.rank, timing.node)].append(timing)
    ranks = {(rank, host) for _, rank, host in groups}
    series, stats = [], []
    for (mode, rank, host), items in sorted(groups.items()):
        items.sort(key=lambda t: t.step)
        label = mode if len(ranks) == 1 else f"{mode} rank {rank} ({host})"
        durations_ms = [t.duration * 1000 for t in items]
        series.append(Series(label, [float(t.step) for t in items], durations_ms))
        stats.append(
            {
                "series": label,
                "steps": len(items),
                "median_ms": float(np.median(durations_ms)),
                "p95_ms": float(np.percentile(durations_ms, 95)),
                "max_ms": float(np.max(durations_ms)),
            }
        )
    charts = [Chart("Step duration", "step", "milliseconds", series)]
    charts += _breakdown_charts(groups, len(ranks))
    return charts, stats


def _breakdown_charts(groups: dict[tuple[str, int, str], list[StepTiming]], rank_count: int) -> list[Chart]:
    """Where TRAIN step time went (data wait, forward, backward, optimizer), where the timeline says.

    SageMaker's own timelines have no split (NaN fields): then there is no chart.
    """
    charts = []
    for (mode, rank, host), items in sorted(groups.items()):
        if mode != "TRAIN":
            continue
        series = []
        for part in ("data", "forward", "backward", "optimizer"):
            points = [(float(t.step), getattr(t, part) * 1000) for t in items if math.isfinite(getattr(t, part))]
            if points:
                series.append(Series(part, [x for x, _ in points], [y for _, y in points]))
        if series:
            where = "" if rank_count == 1 else f" rank {rank} ({host})"
            charts.append(Chart(f"TRAIN step time breakdown{where}", "step", "milliseconds", series))
    return charts


def gather_profiler_sections(store: Store) -> ProfilerSections:
    """System-metric and step-time charts of the run whose root ``store`` is."""
    sections = ProfilerSections()
    system_reader, step_reader = SystemMetricsReader(store), StepTimingReader(store)
    try:
        records = system_reader.read_new()
        timings = step_reader.read_new()
    except StorageError as error:
        sections.note("system", f"could not read {store.url}/{PROFILER_PREFIX}: {error}")
        return sections
    if system_reader.bad_lines:
        sections.note(
            "system", f"{system_reader.bad_lines} unreadable line(s) in the system-metric files were skipped."
        )
    if step_reader.bad_files:
        sections.note("steps", f"{step_reader.bad_files} unreadable timeline file(s) were skipped.")
    sections.system_charts = _system_charts(records)
    dimensions = {record.dimension for record in records}
    if records and layout.GPU_UTILIZATION not in dimensions:
        sections.note("system", "No GPU metrics: the run had no GPU (or the profiler could not read it).")
    if not records:
        sections.note(
            "system", f"No system metrics under {PROFILER_PREFIX}{layout.SYSTEM_PREFIX}: the profiler was off."
        )
    sections.step_charts, sections.step_stats = _step_charts(timings)
    if not timings:
        sections.note(
            "steps", f"No step timings under {PROFILER_PREFIX}{layout.FRAMEWORK_PREFIX}: framework profiling was off."
        )
    return sections
