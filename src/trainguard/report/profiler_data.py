"""The profiler side of a report: system-metric and step-time charts from ``<run>/profiler-output``.

Reads SageMaker's layouts (see :mod:`trainguard.profiler.layout`) through a :class:`Store`, so
local and ``s3://`` runs read the same way. A file that cannot be parsed becomes a note in the
report instead of an error.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from trainguard.errors import StorageError
from trainguard.profiler import layout
from trainguard.report.charts import Chart, Series
from trainguard.storage.base import Store

__all__ = ["ProfilerSections", "StepTiming", "gather_profiler_sections", "read_step_timings", "read_system_records"]

PROFILER_PREFIX = layout.PROFILER_DIR + "/"
_STEP_EVENT_PREFIX = "Step:ModeKeys."


@dataclass(frozen=True)
class StepTiming:
    mode: str
    step: int
    start_s: float  # epoch seconds
    duration_s: float
    rank: int
    host: str


@dataclass
class ProfilerSections:
    system_charts: list[Chart] = field(default_factory=list)
    step_charts: list[Chart] = field(default_factory=list)
    step_stats: list[dict[str, object]] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)

    def note(self, section: str, text: str) -> None:
        self.notes.setdefault(section, []).append(text)


def read_system_records(store: Store, problems: list[str]) -> list[dict]:
    """Every system-metric record under ``profiler-output/system/incremental/``, in time order."""
    records = []
    for key in store.list(PROFILER_PREFIX + layout.SYSTEM_PREFIX):
        if layout.parse_system_key(key) is None:
            continue
        text = store.read(key).decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                record["Value"] = float(record["Value"])
                record["Timestamp"] = float(record["Timestamp"])
            except (ValueError, KeyError, TypeError) as error:
                problems.append(f"{key}:{number}: not a system-metric record ({error})")
                continue
            records.append(record)
    records.sort(key=lambda r: r["Timestamp"])
    return records


def _trace_events(data: object) -> list[dict]:
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [event for event in events if isinstance(event, dict)] if isinstance(events, list) else []


def read_step_timings(store: Store, problems: list[str]) -> list[StepTiming]:
    """``Step:ModeKeys.<MODE>`` events of every framework timeline file, in start order."""
    timings = []
    for key in store.list(PROFILER_PREFIX + layout.FRAMEWORK_PREFIX):
        parsed = layout.parse_framework_key(key)
        if parsed is None:
            continue
        _, rank, host = parsed
        try:
            events = _trace_events(json.loads(store.read(key)))
        except ValueError as error:
            problems.append(f"{key}: not a Chrome trace ({error})")
            continue
        start_us = 0.0
        for event in events:
            if event.get("name") == "process_name" and "start_time_since_epoch_in_micros" in event.get("args", {}):
                start_us = float(event["args"]["start_time_since_epoch_in_micros"])
                break
        for event in events:
            name = str(event.get("name", ""))
            if event.get("ph") != "X" or not name.startswith(_STEP_EVENT_PREFIX):
                continue
            try:
                step = int(event.get("args", {}).get("step_num"))
                timings.append(
                    StepTiming(
                        mode=name[len(_STEP_EVENT_PREFIX) :],
                        step=step,
                        start_s=(start_us + float(event["ts"])) / 1e6,
                        duration_s=float(event["dur"]) / 1e6,
                        rank=rank,
                        host=host,
                    )
                )
            except (KeyError, TypeError, ValueError):
                problems.append(f"{key}: step event without ts/dur/step_num: {json.dumps(event)[:120]}")
    timings.sort(key=lambda t: t.start_s)
    return timings


def _mean_per_timestamp(records: list[dict]) -> tuple[list[float], list[float]]:
    grouped: dict[float, list[float]] = defaultdict(list)
    for record in records:
        grouped[record["Timestamp"]].append(record["Value"])
    times = sorted(grouped)
    return times, [float(np.mean(grouped[t])) for t in times]


def _system_charts(records: list[dict]) -> list[Chart]:
    if not records:
        return []
    origin = records[0]["Timestamp"]
    by_dimension: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_dimension[str(record.get("Dimension"))].append(record)

    def per_node(selected: list[dict], label: str) -> list[Series]:
        """One series per node, averaging the per-core (or per-device) values of each sample."""
        nodes: dict[str, list[dict]] = defaultdict(list)
        for record in selected:
            nodes[str(record.get("NodeId", "node"))].append(record)
        series = []
        for node, items in sorted(nodes.items()):
            times, values = _mean_per_timestamp(items)
            name = label if len(nodes) == 1 else f"{node} {label}"
            series.append(Series(name, [t - origin for t in times], values))
        return series

    def per_device(selected: list[dict]) -> list[Series]:
        devices: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for record in selected:
            devices[(str(record.get("NodeId", "node")), str(record.get("Name")))].append(record)
        nodes = {node for node, _ in devices}
        return [
            Series(name if len(nodes) == 1 else f"{node} {name}", *map(list, zip(*[(r["Timestamp"] - origin, r["Value"]) for r in items])))
            for (node, name), items in sorted(devices.items())
        ]

    charts = []
    x_label = "seconds since profiling started"
    cpu = by_dimension.get(layout.TOTAL_CPU_UTILIZATION) or by_dimension.get(layout.CPU_UTILIZATION, [])
    charts.append(Chart("CPU utilization", x_label, "% busy (all cores)", per_node(cpu, "CPU")))
    memory = [r for r in records if r.get("Name") == "MemoryUsedPercent"]
    charts.append(Chart("Host memory used", x_label, "% of memory", per_node(memory, "memory")))
    for dimension, title in ((layout.GPU_UTILIZATION, "GPU utilization"), (layout.GPU_MEMORY_UTILIZATION, "GPU memory used")):
        if by_dimension.get(dimension):
            charts.append(Chart(title, x_label, "%", per_device(by_dimension[dimension])))
    io_wait = by_dimension.get(layout.TOTAL_IO_WAIT) or by_dimension.get(layout.IO_WAIT, [])
    charts.append(Chart("I/O wait", x_label, "% of CPU time", per_node(io_wait, "I/O wait")))
    throughput = []
    for dimension, label in (
        (layout.DISK_READ, "disk read"), (layout.DISK_WRITE, "disk write"),
        (layout.NET_RECEIVE, "network receive"), (layout.NET_TRANSMIT, "network transmit"),
    ):  # fmt: skip
        items = [dict(r, Value=r["Value"] / 2**20) for r in by_dimension.get(dimension, [])]
        throughput += per_node(items, label)
    if throughput:
        charts.append(Chart("Disk and network throughput", x_label, "MiB/s", throughput))
    return charts


def _step_charts(timings: list[StepTiming]) -> tuple[list[Chart], list[dict[str, object]]]:
    if not timings:
        return [], []
    groups: dict[tuple[str, int, str], list[StepTiming]] = defaultdict(list)
    for timing in timings:
        groups[(timing.mode, timing.rank, timing.host)].append(timing)
    ranks = {(rank, host) for _, rank, host in groups}
    series, stats = [], []
    for (mode, rank, host), items in sorted(groups.items()):
        items.sort(key=lambda t: t.step)
        label = mode if len(ranks) == 1 else f"{mode} rank {rank} ({host})"
        durations_ms = [t.duration_s * 1000 for t in items]
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
    return [Chart("Step duration", "step", "milliseconds", series)], stats


def gather_profiler_sections(store: Store) -> ProfilerSections:
    """System-metric and step-time charts of the run whose root ``store`` is."""
    sections = ProfilerSections()
    problems: list[str] = []
    try:
        records = read_system_records(store, problems)
        timings = read_step_timings(store, problems)
    except StorageError as error:
        sections.note("system", f"could not read {store.url}/{PROFILER_PREFIX}: {error}")
        return sections
    for problem in problems[:20]:
        sections.note("system", problem)
    sections.system_charts = _system_charts(records)
    dimensions = {record.get("Dimension") for record in records}
    if records and layout.GPU_UTILIZATION not in dimensions:
        sections.note("system", "No GPU metrics: the run had no GPU (or the profiler could not read it).")
    if not records:
        sections.note("system", f"No system metrics under {PROFILER_PREFIX}{layout.SYSTEM_PREFIX}: the profiler was off.")
    sections.step_charts, sections.step_stats = _step_charts(timings)
    if not timings:
        sections.note("steps", f"No step timings under {PROFILER_PREFIX}{layout.FRAMEWORK_PREFIX}: framework profiling was off.")
    return sections
