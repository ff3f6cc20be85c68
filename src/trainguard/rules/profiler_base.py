"""Base class of the profiler rules: incremental scans of a run's ``profiler-output``.

A profiler rule gets the run's tensor trial as ``base_trial`` (its ``store``, else its ``path``,
locates ``<run>/profiler-output``; a plain path or Store works too). The runner calls
``check(step)`` per new tensor step, ``check_idle(now)`` on every idle poll and ``finish()`` at
the end; all three read only the profiler data written since the last scan (at most one scan
per ``scan_interval_us``, except ``finish``, which always scans) and hand it to the subclass:

* :meth:`ProfilerRule.on_system_metrics` — new system-metric records, sorted by time;
* :meth:`ProfilerRule.on_steps` — new per-step timings;
* :meth:`ProfilerRule.assess` — the condition on everything seen so far; returns an issue, a
  no-issue (with statistics in ``details``) or None.

``check``/``check_idle`` return None when no new data arrived, so an idle run produces no
results; a rule with a time condition (MaxInitializationTime) overrides :meth:`idle_due`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from trainguard.profiler import layout as L
from trainguard.profiler.reader import StepTiming, StepTimingReader, SystemMetric, SystemMetricsReader
from trainguard.rules.base import Rule, StepResult
from trainguard.rules.params import Param

__all__ = ["GpuIdleSnapshotRule", "ProfilerRule", "SeriesStore", "SnapshotGrouper", "parse_mode", "percent", "positive"]

_GPU_DIMENSIONS = frozenset({L.GPU_UTILIZATION, L.GPU_MEMORY_UTILIZATION})
SNAPSHOT_SPAN_S = 0.020  # records within 20 ms of a snapshot's first belong to it (SageMaker's)


def positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


def percent(value: Any) -> str | None:
    return None if 0 <= value <= 100 else "must be a percentage between 0 and 100"


def parse_mode(value: str | None) -> str | None:
    """``TRAIN``, ``ModeKeys.TRAIN``, ``train`` → ``"TRAIN"``; None/empty → None (all modes)."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip().upper().rsplit(".", 1)[-1]
    if text not in {"TRAIN", "EVAL", "PREDICT", "GLOBAL"}:
        raise ValueError(f"mode {value!r} is not one of TRAIN, EVAL, PREDICT, GLOBAL")
    return text


class SnapshotGrouper:
    """Groups a node's records into samples (snapshots): records within 20 ms of each other.

    The newest group of each node is held back until a later record shows it is complete
    (or :meth:`flush` at the end), so a sample split across two scans is never counted twice.
    """

    def __init__(self) -> None:
        self._open: dict[str, list[SystemMetric]] = {}

    def add(self, records: Iterable[SystemMetric]) -> list[list[SystemMetric]]:
        done: list[list[SystemMetric]] = []
        for record in records:
            group = self._open.get(record.node)
            if group and record.timestamp - group[0].timestamp > SNAPSHOT_SPAN_S:
                done.append(group)
                group = None
            if group is None:
                group = self._open[record.node] = []
            group.append(record)
        return done

    def flush(self) -> list[list[SystemMetric]]:
        done = [group for group in self._open.values() if group]
        self._open.clear()
        return done


class ProfilerRule(Rule):
    """A rule on profiler data (``kind = "profiler"``, no tensor collections)."""

    kind: ClassVar[str] = "profiler"
    collections: ClassVar[tuple[str, ...]] = ()
    uses_system: ClassVar[bool] = True
    uses_steps: ClassVar[bool] = False
    # Judges GPUs only: a run whose profiler data holds no GPU metric (a CPU-only machine) ends
    # not applicable (not evaluated, counted apart in summaries) saying so, never NoIssuesFound.
    needs_gpu: ClassVar[bool] = False

    scan_interval_us = Param(
        int, 1_000_000, "least time between two scans of new profiler data while training runs (µs)",
        check=positive, documented_default=60_000_000,
    )  # fmt: skip

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self._system_reader: SystemMetricsReader | None = None
        self._step_reader: StepTimingReader | None = None
        self._last_scan = -math.inf
        self.last_step = -1
        self.first_timestamp: float | None = None  # earliest profiler data seen (epoch s)
        self.last_timestamp: float | None = None  # latest
        self.saw_gpu = False  # any GPU metric among the system records read

    # -- what subclasses implement -------------------------------------------------------------
    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        """New system-metric records (sorted by time)."""

    def on_steps(self, steps: Sequence[StepTiming]) -> None:
        """New per-step timings (sorted by start)."""

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        """The condition on everything seen so far. ``now`` is the wall clock for idle checks."""
        raise NotImplementedError

    def idle_due(self, now: float) -> bool:
        """Whether an idle poll without new data should still assess (time-based conditions)."""
        return False

    # -- the runner's entry points ---------------------------------------------------------
    def check(self, step: int) -> StepResult | None:
        self.last_step = max(self.last_step, step)
        if not self.scan():
            return None
        return self.assess(None, final=False)

    def check_idle(self, now: float) -> StepResult | None:
        if self.scan() or self.idle_due(now):
            return self.assess(now, final=False)
        return None

    def finish(self) -> StepResult | None:
        self.scan(force=True)
        self.on_finish()
        result = self.assess(None, final=True)
        if result is None and self.needs_gpu and self.first_timestamp is not None and not self.saw_gpu:
            # by the run's design (a machine without a GPU): counted among the rules that do not apply
            return self.not_applicable(
                "no GPU metrics in the profiler data (no GPU on this machine, or none the profiler can read): "
                f"{self.name()} judges GPUs only",
                self.last_step,
            )
        if result is None and self.first_timestamp is None:
            return self.no_issue(
                self.last_step,
                "no profiler data in this run (profiler-output/ is empty or missing): start the profiler with "
                "TRAINGUARD_PROFILER=1 (trainguard run) or trainguard.profiler.Profiler(out_dir)",
            )
        return result

    def on_finish(self) -> None:
        """Called before the final assessment (flush held-back data here)."""

    # -- scanning -------------------------------------------------------------------------------
    def _profiler_location(self) -> Any:
        trial = self.base_trial
        if isinstance(trial, (str, os.PathLike)):
            return trial
        store = getattr(trial, "store", None)
        if store is not None:
            return store
        return trial.path

    def scan(self, force: bool = False) -> bool:
        """Read what is new (at most once per ``scan_interval_us`` unless forced); True if any."""
        clock = time.monotonic()
        if not force and clock - self._last_scan < self.scan_interval_us / 1e6:
            return False
        self._last_scan = clock
        if self._system_reader is None and self.uses_system:
            self._system_reader = SystemMetricsReader(self._profiler_location())
        if self._step_reader is None and (self.uses_steps or not self.uses_system):
            self._step_reader = StepTimingReader(self._profiler_location())
        records = self._system_reader.read_new() if self._system_reader else []
        steps = self._step_reader.read_new() if self._step_reader else []
        stamps = [r.timestamp for r in records[:1] + records[-1:]]
        stamps += [s.start for s in steps[:1]] + [s.end for s in steps[-1:]]
        if self._step_reader is not None and self._step_reader.first_timestamp is not None:
            stamps.append(self._step_reader.first_timestamp)
        if stamps:
            low, high = min(stamps), max(stamps)
            self.first_timestamp = low if self.first_timestamp is None else min(self.first_timestamp, low)
            self.last_timestamp = high if self.last_timestamp is None else max(self.last_timestamp, high)
        if records:
            self.saw_gpu = self.saw_gpu or any(r.dimension in _GPU_DIMENSIONS for r in records)
            self.on_system_metrics(records)
        if steps:
            self.on_steps(steps)
        return bool(records or steps)

    @property
    def cpu_counts(self) -> dict[tuple[str, int], int]:
        """Cores of each (host, rank) as its timelines recorded them."""
        return dict(self._step_reader.cpu_count) if self._step_reader else {}


class GpuIdleSnapshotRule(ProfilerRule):
    """Shared by CPUBottleneck and IOBottleneck: counts snapshots where a GPU idles while
    :meth:`busy_side` holds."""

    gpu_threshold = Param(float, 10.0, "a GPU below this utilization (%) counts as idle", check=percent)
    patience = Param(
        int, 1000, "snapshots with GPU data needed before deciding", check=positive, documented_default=100
    )
    threshold = Param(float, 50.0, "fire when more than this % of snapshots are bottlenecks", check=percent)

    busy_dimension = L.CPU_UTILIZATION
    busy_parameter = "cpu_threshold"
    what = "CPU"

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self._grouper = SnapshotGrouper()
        self.datapoints = 0
        self.bottlenecks = 0
        self.snapshots_without_gpu = 0

    def busy_limit(self) -> float:
        return float(getattr(self, self.busy_parameter))

    def _count(self, snapshots: Sequence[list[SystemMetric]]) -> None:
        limit = self.busy_limit()
        gpu_limit = self.gpu_threshold
        for snapshot in snapshots:
            gpus = [r.value for r in snapshot if r.dimension == L.GPU_UTILIZATION]
            if not gpus:
                self.snapshots_without_gpu += 1
                continue
            self.datapoints += 1
            busy = any(r.value > limit for r in snapshot if r.dimension == self.busy_dimension)
            if busy and min(gpus) < gpu_limit:
                self.bottlenecks += 1

    def on_system_metrics(self, records: Sequence[SystemMetric]) -> None:
        self._count(self._grouper.add(records))

    def on_finish(self) -> None:
        self._count(self._grouper.flush())

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        details: dict[str, Any] = {"datapoints": self.datapoints, "bottlenecks": self.bottlenecks,
                   "snapshots_without_gpu": self.snapshots_without_gpu}  # fmt: skip
        if self.datapoints == 0:
            if self.snapshots_without_gpu:
                return self.no_issue(
                    self.last_step,
                    f"no GPU metrics in the profiler data: {self.name()} needs an idle GPU to fire "
                    "(on CPU-only machines see Dataloader and StepOutlier)",
                    **details,
                )
            return None
        ratio = 100.0 * self.bottlenecks / self.datapoints
        details["bottleneck_percent"] = round(ratio, 2)
        if self.datapoints > self.patience and ratio > self.threshold:
            return self.issue(
                self.last_step,
                f"{ratio:.1f}% of {self.datapoints} samples had a GPU below {self.gpu_threshold:g}% while "
                f"{self.what} was above {self.busy_limit():g}% (threshold {self.threshold:g}%)",
                **details,
            )
        return self.no_issue(self.last_step, **details)


class SeriesStore:
    """Growing per-key float series (e.g. per (node, gpu)), appended in chunks."""

    def __init__(self) -> None:
        self._chunks: dict[Any, list[np.ndarray]] = {}
        self._arrays: dict[Any, np.ndarray] = {}

    def extend(self, key: Any, values: Sequence[float]) -> None:
        self._chunks.setdefault(key, []).append(np.asarray(values, dtype=np.float64))

    def get(self, key: Any) -> np.ndarray:
        chunks = self._chunks.get(key)
        if chunks:
            self._arrays[key] = np.concatenate([self._arrays.get(key, np.empty(0)), *chunks])
            self._chunks[key] = []
        return self._arrays.get(key, np.empty(0))

    def keys(self) -> list[Any]:
        return sorted(set(self._chunks) | set(self._arrays))
