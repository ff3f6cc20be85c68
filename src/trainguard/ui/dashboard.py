"""The dashboard's data, independent of the web server serving it.

:class:`Dashboard` answers the pages' requests with ``(status, document)``. ``trainguard ui``
builds one over paths (:class:`PathRuns`); the service builds one per caller over the jobs the
caller may describe, so the authorisation stays the native API's.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from trainguard.errors import TrainguardError
from trainguard.ui.discover import RunLocation, discover_runs
from trainguard.ui.live import LiveRun
from trainguard.ui.views import run_detail, run_series, run_summary

__all__ = ["Dashboard", "PathRuns", "RunSource"]


class RunSource(Protocol):
    """Where a dashboard's runs come from."""

    def locations(self) -> tuple[list[RunLocation], list[str]]:
        """The runs to list now, and problem lines (a path that cannot be read)."""
        ...


class PathRuns:
    """Runs under local paths and ``s3://`` URIs, discovered again at most every ``every_s``."""

    def __init__(self, paths: list[str], *, endpoint_url: str | None = None, every_s: float = 2.0) -> None:
        self.paths = list(paths)
        self.endpoint_url = endpoint_url
        self.every_s = every_s
        self._found: tuple[list[RunLocation], list[str]] = ([], [])
        self._at = -float("inf")
        self._lock = threading.Lock()

    def locations(self) -> tuple[list[RunLocation], list[str]]:
        with self._lock:
            if time.monotonic() - self._at >= self.every_s:
                self._found = discover_runs(self.paths, endpoint_url=self.endpoint_url)
                self._at = time.monotonic()
            return self._found


class Dashboard:
    """Open runs kept in a bounded LRU (``max_open``): memory follows what is shown."""

    def __init__(
        self,
        source: RunSource,
        *,
        max_open: int = 64,
        extra: Callable[[LiveRun], dict[str, Any]] | None = None,
        open_runs: OrderedDict[str, LiveRun] | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.source = source
        self.max_open = max_open
        self.extra = extra  # per-run additions (the service's job: name, status, rule results)
        # ``open_runs``/``lock``: shared by the per-caller dashboards of the service, so that two
        # callers looking at one job read it once; what each may see is its source's business
        self._open: OrderedDict[str, LiveRun] = open_runs if open_runs is not None else OrderedDict()
        self._lock = lock or threading.Lock()

    def _run(self, location: RunLocation) -> LiveRun:
        with self._lock:
            run = self._open.get(location.id)
            if run is None:
                run = self._open[location.id] = LiveRun(location)
            self._open.move_to_end(location.id)
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
            return run

    def find(self, run_id: str) -> LiveRun | None:
        locations, _ = self.source.locations()
        for location in locations:
            if location.id == run_id:
                return self._run(location)
        return None

    def _with_extra(self, run: LiveRun, view: Callable[[LiveRun], dict[str, Any]]) -> dict[str, Any]:
        """``view(run)`` with the source's additions; those are made first (they may set the rules)."""
        extra = self.extra(run) if self.extra is not None else {}
        return {**view(run), **extra}

    def list_runs(self, query: str = "") -> tuple[int, dict[str, Any]]:
        locations, problems = self.source.locations()
        rows = []
        for location in locations[: self.max_open]:
            run = self._run(location)
            run.refresh(curves=False)
            with run.lock:
                rows.append(self._with_extra(run, run_summary))
        if query:
            needle = query.lower()
            rows = [
                row for row in rows if needle in f"{row['name']} {row['path']} {row['status']} {row['primary']}".lower()
            ]
        rows.sort(key=lambda row: -(row.get("updated_at") or row.get("started_at") or 0))
        note = [f"showing {self.max_open} of {len(locations)} runs"] if len(locations) > self.max_open else []
        return 200, {"runs": rows, "problems": problems + note, "generated_at": time.time()}

    def detail(self, run_id: str) -> tuple[int, dict[str, Any]]:
        run = self.find(run_id)
        if run is None:
            return 404, {"error": f"no run {run_id}"}
        run.refresh()
        with run.lock:
            return 200, self._with_extra(run, run_detail)

    def series(self, run_id: str, since: int | None) -> tuple[int, dict[str, Any]]:
        run = self.find(run_id)
        if run is None:
            return 404, {"error": f"no run {run_id}"}
        run.refresh()
        with run.lock:
            return 200, run_series(run, since)

    def histogram(self, run_id: str, tensor: str, step: int, worker: str | None) -> tuple[int, dict[str, Any]]:
        run = self.find(run_id)
        if run is None:
            return 404, {"error": f"no run {run_id}"}
        try:
            return 200, run.histogram(tensor, step, worker)
        except (TrainguardError, KeyError) as error:
            return 404, {"error": f"no value of {tensor} at step {step}: {error}"}
