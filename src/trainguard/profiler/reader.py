"""Reading profiler output: system metrics and per-step timings, whole or incrementally.

    from trainguard.profiler import read_system_metrics, read_step_timings
    metrics = read_system_metrics("runs/job1")     # list[SystemMetric], by timestamp
    steps = read_step_timings("runs/job1")         # list[StepTiming], by start time

``path`` is a run directory (holding ``profiler-output/``), the ``profiler-output`` folder
itself, an ``s3://``/``memory://`` URL of either, a Store, or a tensor Trial of the run. The readers understand files
written by trainguard and by SageMaker (which has no forward/backward split: those fields are
NaN there). For following a live run, :class:`SystemMetricsReader` and :class:`StepTimingReader`
return only what is new on each :meth:`read_new` call.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.errors import ObjectNotFound
from trainguard.profiler.layout import (
    FRAMEWORK_PREFIX,
    PROFILER_DIR,
    SYSTEM_PREFIX,
    parse_framework_key,
    parse_system_key,
)
from trainguard.storage import open_store
from trainguard.storage.base import Store

__all__ = [
    "StepTiming",
    "StepTimingReader",
    "SystemMetric",
    "SystemMetricsReader",
    "locate_profiler_output",
    "metric_series",
    "read_step_timings",
    "read_system_metrics",
]

logger = logging.getLogger("trainguard")

# A minute file may still grow while its minute is current and until the writer's last flush
# of it; older than this (relative to the newest file seen) it is treated as complete.
_SETTLED_AFTER_S = 180


@dataclass(frozen=True)
class SystemMetric:
    """One SageMaker system-metric record."""

    timestamp: float  # epoch seconds; all records of one sample share it
    node: str  # NodeId, e.g. "algo-1"
    type: str  # "cpu", "gpu", "memory", "disk", "network"
    name: str  # "cpu0", "gpu1", "MemoryUsedPercent", ...
    dimension: str  # "CPUUtilization", "GPUUtilization", ... (see trainguard.profiler.layout)
    value: float


@dataclass(frozen=True)
class StepTiming:
    """One training (or evaluation) step of one process. Times in seconds.

    ``duration`` runs from the end of the previous step (or the first data fetch of this one)
    to the end of this step (its last optimizer step; for EVAL its last forward), so
    ``duration ≈ data + forward + backward + optimizer + other`` where other is the loss, logging
    and whatever else the loop does. The split fields are NaN in SageMaker's own timelines.
    """

    node: str  # host part of the timeline file name
    rank: int
    mode: str  # "TRAIN", "EVAL", "PREDICT" or "GLOBAL"
    step: int  # step number within the mode (SageMaker's step_num)
    start: float  # epoch seconds
    duration: float
    data: float  # waiting for the next batch before the forward started
    forward: float
    backward: float
    optimizer: float
    dataloader_workers: int | None = None  # num_workers of the DataLoader that fed the step

    @property
    def end(self) -> float:
        return self.start + self.duration


def locate_profiler_output(path: str | os.PathLike[str] | Store, **store_options: Any) -> tuple[Store, str]:
    """(store, key prefix of profiler-output) for a run, its profiler-output folder, a Store or a
    Trial (its store).

    A caching store is bypassed: profiler minute files grow during a run, so they are never
    served from a cache.
    """
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path).rstrip("/")
        if text.endswith("/" + PROFILER_DIR) or text == PROFILER_DIR:
            parent = text[: -len(PROFILER_DIR)].rstrip("/") or "."
            return open_store(parent, **store_options), PROFILER_DIR + "/"
        store = open_store(text, **store_options)
    else:
        store = getattr(path, "store", path)  # a Trial: its store
        store = getattr(store, "inner", store)
    if not store.list(PROFILER_DIR + "/")[:1] and (store.list(SYSTEM_PREFIX)[:1] or store.list(FRAMEWORK_PREFIX)[:1]):
        return store, ""
    return store, PROFILER_DIR + "/"


class _IncrementalKeys:
    """Lists keys under a prefix, skipping the settled head that was already read."""

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self._after: str | None = None

    def list(self) -> list[str]:
        return self.store.list(self.prefix, start_after=self._after)

    def settle(self, key: str) -> None:
        """Every key up to ``key`` is complete and read: don't list them again."""
        if self._after is None or key > self._after:
            self._after = key


class SystemMetricsReader:
    """Follows the system-metric files of a run; :meth:`read_new` returns records not yet seen."""

    def __init__(self, path: str | os.PathLike[str] | Store, **store_options: Any) -> None:
        self.store, root = locate_profiler_output(path, **store_options)
        self._keys = _IncrementalKeys(self.store, root + SYSTEM_PREFIX)
        self._offsets: dict[str, int] = {}
        self.bad_lines = 0

    def read_new(self) -> list[SystemMetric]:
        keys = [key for key in self._keys.list() if parse_system_key(key)]
        records: list[SystemMetric] = []
        for key in keys:
            offset = self._offsets.get(key, 0)
            try:
                if self.store.size(key) <= offset:
                    continue
                data = self.store.read(key, start=offset)
            except ObjectNotFound:
                continue
            complete = data.rfind(b"\n") + 1  # only whole lines: the writer may be mid-line
            if complete:
                records.extend(self._parse(data[:complete]))
                self._offsets[key] = offset + complete
        self._settle(keys)
        records.sort(key=lambda record: record.timestamp)
        return records

    def _settle(self, keys: list[str]) -> None:
        if not keys:
            return
        newest = max(parse_system_key(key)[0] for key in keys)  # type: ignore[index]
        for key in keys:  # sorted: the settled ones form a head
            if parse_system_key(key)[0] >= newest - _SETTLED_AFTER_S:  # type: ignore[index]
                break
            self._keys.settle(key)
            self._offsets.pop(key, None)

    def _parse(self, data: bytes) -> Iterable[SystemMetric]:
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                yield SystemMetric(
                    float(item["Timestamp"]), str(item.get("NodeId", "")), str(item.get("Type", "")),
                    str(item["Name"]), str(item["Dimension"]), float(item["Value"]),
                )  # fmt: skip
            except (ValueError, KeyError, TypeError):
                self.bad_lines += 1


class StepTimingReader:
    """Follows the framework timelines of a run; :meth:`read_new` returns steps not yet seen.

    Also collected while reading: ``first_timestamp`` (earliest start of any timeline file, epoch
    s) and ``cpu_count`` by (host, rank) as written by trainguard's profiler.
    """

    def __init__(self, path: str | os.PathLike[str] | Store, **store_options: Any) -> None:
        self.store, root = locate_profiler_output(path, **store_options)
        self._keys = _IncrementalKeys(self.store, root + FRAMEWORK_PREFIX)
        self._seen: set[str] = set()
        self.first_timestamp: float | None = None
        self.cpu_count: dict[tuple[str, int], int] = {}
        self.bad_files = 0

    def read_new(self) -> list[StepTiming]:
        keys = [key for key in self._keys.list() if key not in self._seen and parse_framework_key(key)]
        steps: list[StepTiming] = []
        for key in keys:
            try:
                data = self.store.read(key)
            except ObjectNotFound:
                continue
            self._seen.add(key)
            steps.extend(self._parse(key, data))
        self._settle()
        steps.sort(key=lambda step: step.start)
        return steps

    def _settle(self) -> None:
        # Files appear whole, but ranks close theirs at slightly different times, so a key that
        # sorts before one already seen can still appear: only settle well-aged keys.
        if not self._seen:
            return
        newest = max(parse_framework_key(key)[0] for key in self._seen)  # type: ignore[index]
        for key in sorted(self._seen):
            if parse_framework_key(key)[0] >= newest - _SETTLED_AFTER_S * 1e6:  # type: ignore[index]
                break
            self._keys.settle(key)
            self._seen.discard(key)

    def _parse(self, key: str, data: bytes) -> list[StepTiming]:
        _, rank, host = parse_framework_key(key)  # type: ignore[misc]
        events = _load_trace(data)
        if events is None:
            self.bad_files += 1
            logger.warning("trainguard: skipping unreadable profiler timeline %s", key)
            return []
        start_us = 0
        for event in events:
            args = event.get("args") or {}
            if event.get("ph") == "M" and "start_time_since_epoch_in_micros" in args:
                start_us = int(args["start_time_since_epoch_in_micros"])
                if "cpu_count" in args:
                    self.cpu_count[(host, rank)] = int(args["cpu_count"])
                break
        first = start_us / 1e6
        self.first_timestamp = first if self.first_timestamp is None else min(self.first_timestamp, first)
        steps = []
        for event in events:
            name = str(event.get("name", ""))
            if event.get("ph") != "X" or not name.startswith("Step:ModeKeys."):
                continue
            args = event.get("args") or {}
            try:
                steps.append(
                    StepTiming(
                        node=host, rank=rank, mode=name[len("Step:ModeKeys.") :],
                        step=int(args.get("step_num", -1)),
                        start=(start_us + float(event["ts"])) / 1e6, duration=float(event["dur"]) / 1e6,
                        data=_seconds(args.get("data_us")), forward=_seconds(args.get("forward_us")),
                        backward=_seconds(args.get("backward_us")), optimizer=_seconds(args.get("optimizer_us")),
                        dataloader_workers=int(args["dataloader_workers"]) if "dataloader_workers" in args else None,
                    )
                )  # fmt: skip
            except (KeyError, TypeError, ValueError):
                continue
        return steps


def _seconds(micros: Any) -> float:
    return float(micros) / 1e6 if micros is not None else math.nan


def _load_trace(data: bytes) -> list[dict[str, Any]] | None:
    """A Chrome trace array; tolerates a file that was never closed (SageMaker's open files)."""
    text = data.decode("utf-8", errors="replace").strip()
    for candidate in (text, text.rstrip(",") + "]", text.rstrip(",") + "\n]"):
        try:
            loaded = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(loaded, dict):
            loaded = loaded.get("traceEvents", [])
        return [event for event in loaded if isinstance(event, dict)] if isinstance(loaded, list) else None
    return None


def read_system_metrics(path: str | os.PathLike[str] | Store, **store_options: Any) -> list[SystemMetric]:
    """Every system-metric record of a run, sorted by timestamp."""
    return SystemMetricsReader(path, **store_options).read_new()


def read_step_timings(path: str | os.PathLike[str] | Store, **store_options: Any) -> list[StepTiming]:
    """Every step recorded in a run's framework timelines, sorted by start time."""
    return StepTimingReader(path, **store_options).read_new()


def metric_series(
    metrics: Iterable[SystemMetric], dimension: str
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """``{(node, name): (timestamps, values)}`` of one dimension, each sorted by time."""
    grouped: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for metric in metrics:
        if metric.dimension == dimension:
            grouped.setdefault((metric.node, metric.name), []).append((metric.timestamp, metric.value))
    out = {}
    for key, pairs in sorted(grouped.items()):
        pairs.sort()
        array = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
        out[key] = (array[:, 0], array[:, 1])
    return out
