"""One run as the dashboard sees it, kept open between refreshes: its listing (incremental and
bounded: :mod:`trainguard.ui.listing`), its curves (a cursor), its rule results, stop record and
status.

Everything a page asks for goes through :meth:`LiveRun.refresh`, which does at most one round of
work per ``min_interval`` whatever the number of pages polling, so ten open tabs cost what one does.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

import numpy as np

from trainguard.errors import MissingCollectionFiles, StorageError, TrainguardError
from trainguard.format.layout import END_OF_TRAINING, RUN_EXIT_RECORD, index_key
from trainguard.storage import sidecar_root
from trainguard.storage.base import Store
from trainguard.ui.curves import REDUCTION_PREFIX, RunCurves
from trainguard.ui.discover import RunLocation, modified_at
from trainguard.ui.findings import RuleState
from trainguard.ui.listing import RunListing

__all__ = ["EXIT_RECORD", "STOP_RECORD", "LiveRun"]

logger = logging.getLogger("trainguard")

STOP_RECORD = "trainguard-stop.json"
EXIT_RECORD = RUN_EXIT_RECORD
_PROFILER_EVERY_S = 15.0


class LiveRun:
    """A run followed live. Thread-safe: one refresh at a time, readers see the last one."""

    def __init__(self, location: RunLocation, *, min_interval: float = 0.5, budget_s: float = 0.5) -> None:
        self.location = location
        self.min_interval = min_interval
        self.budget_s = budget_s
        self.curves = RunCurves()
        self.rules = RuleState()
        # False when the rule results come from elsewhere (the service's database) via rules.set_results
        self.rules_from_store = True
        self.listing: RunListing | None = None
        self.trial_error = ""
        self.stop: dict[str, Any] | None = None
        self.exit: dict[str, Any] | None = None
        self.ended = False
        self.started_at: float | None = None
        self.updated_at: float | None = None
        self.steps = 0
        self.last_step: int | None = None
        self.workers: list[str] = []
        self.damaged: list[dict[str, Any]] = []
        self.capture_stopped: list[dict[str, Any]] = []
        self.profiler: dict[str, Any] = {"charts": [], "notes": []}
        self._profiled_at = -math.inf
        self._refreshed_at = -math.inf
        # read a backlog on a thread between polls (the static report reads everything at once)
        self.catch_up = budget_s != math.inf
        self._catching_up: threading.Thread | None = None
        self._curves_read = False
        # held while reading and while a page's document is built from this run (the catch-up
        # thread adds points meanwhile); re-entrant: building a document calls into the run
        self.lock = threading.RLock()
        self._lock = self.lock
        self._store: Store | None = None
        self._sidecar: Store | None = None

    # -- reading ---------------------------------------------------------------------------
    def _stores(self) -> tuple[Store, Store]:
        if self._store is None or self._sidecar is None:
            self._store = self.location.open()
            sidecar = sidecar_root(self.location.url)
            self._sidecar = (
                self._store if sidecar == self.location.url else RunLocation(sidecar, self.location.options).open()
            )
        return self._store, self._sidecar

    def refresh(self, *, force: bool = False, curves: bool = True) -> None:
        """Read what was written since the last refresh (at most once per ``min_interval``);
        ``curves=False`` (the list page) reads the listing, rules and status but no values."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._refreshed_at < self.min_interval and (self._curves_read or not curves):
                return
            self._refreshed_at = now
            self._curves_read = curves
            try:
                self._refresh(curves)
            except TrainguardError as error:  # a store gone away: shown, tried again next time
                self.trial_error = str(error)
            except Exception as error:  # noqa: BLE001 - one unreadable run must not take the page down
                logger.warning("trainguard ui: cannot read %s: %s", self.location.url, error)
                self.trial_error = f"{type(error).__name__}: {error}"
            if curves and self.catch_up and self.listing is not None and self.listing.backlog():
                self._start_catching_up()

    def _start_catching_up(self) -> None:
        """Read a backlog (a long run opened late) in slices on a thread of its own, so it fills in
        between the page's polls instead of only during them; one thread per run at most."""
        if self._catching_up is not None and self._catching_up.is_alive():
            return

        def read_on() -> None:
            while True:
                with self._lock:
                    listing = self.listing
                    if listing is None or not listing.backlog():
                        return
                    try:
                        self.curves.update(listing, budget_s=self.budget_s)
                    except Exception as error:  # noqa: BLE001 - the next refresh tries again
                        logger.warning("trainguard ui: cannot read %s: %s", self.location.url, error)
                        return
                time.sleep(0.01)  # let the pages' requests take the lock between slices

        self._catching_up = threading.Thread(target=read_on, name="trainguard-ui-catch-up", daemon=True)
        self._catching_up.start()

    @property
    def trial(self) -> RunListing | None:
        """The run's listing; None until its collections file is there (the report asks)."""
        return self.listing

    def _refresh(self, curves: bool) -> None:
        store, sidecar = self._stores()
        if self.listing is None:
            try:
                self.listing = RunListing(store)
                self.trial_error = ""
            except MissingCollectionFiles as error:
                self.trial_error = str(error)
        listing = self.listing
        if listing is not None:
            steps_before = self.steps
            listing.refresh()
            if curves:
                # the first answer comes quickly; the catch-up thread reads the rest (a static
                # report, without that thread, reads everything now)
                first = self.curves.cursor < 0 and self.catch_up
                self.curves.update(listing, budget_s=min(self.budget_s, 0.2) if first else self.budget_s)
            self.steps, self.last_step = listing.steps, listing.last_step
            self.workers = sorted(listing.workers)
            self.ended = listing.training_ended
            if self.started_at is None and listing.first_step is not None:
                self.started_at = self._first_time(store, listing.first_step)
            last_key = listing.last_key()
            if self.steps != steps_before and last_key is not None:
                self.updated_at = modified_at(store, last_key) or time.time()
            self.damaged = listing.damage()
            self.capture_stopped = [
                {"worker": worker, **record} for worker, record in sorted(listing.capture_stopped().items())
            ]
        else:
            self.ended = store.exists(END_OF_TRAINING)
        if self.rules_from_store:
            self.rules.refresh(sidecar)
        self.stop = _read_json(sidecar, STOP_RECORD) or self.stop
        self.exit = _read_json(sidecar, EXIT_RECORD) or self.exit
        if self.ended and self.updated_at is None:
            self.updated_at = modified_at(store, END_OF_TRAINING)
        if time.monotonic() - self._profiled_at > _PROFILER_EVERY_S:
            self._profiled_at = time.monotonic()
            self.profiler = _profiler(sidecar)

    def _first_time(self, store: Store, step: int) -> float | None:
        # the first step's index, not the collections file: hooks rewrite that one mid-run
        for key in (index_key(step, self.workers[0]), "collections/000000000/worker_0_collections.json"):
            stamp = modified_at(store, key)
            if stamp is not None:
                return stamp
        return None

    # -- what pages show -------------------------------------------------------------------
    def status(self) -> tuple[str, str]:
        """(status, one line): stopped (by a rule), failed, completed or running."""
        if self.stop:
            by = self.stop.get("configuration_name") or self.stop.get("rule")
            return "stopped", f"stopped by {by} at step {self.stop.get('step')}"
        code = (self.exit or {}).get("returncode")
        if isinstance(code, int) and code != 0:
            return "failed", f"training exited with status {code}"
        if self.ended or code is not None:
            return "completed", "training ended"
        if self.trial is None and self.trial_error:
            return "running", "waiting for the first saved step"
        return "running", f"at step {self.last_step}" if self.last_step is not None else "starting"

    def stop_view(self) -> dict[str, Any] | None:
        if not self.stop:
            return None
        stop = self.stop
        reported = stop.get("finding_reported_at")
        gone = stop.get("stopped_at") or stop.get("signalled_at")
        delay = gone - reported if isinstance(reported, (int, float)) and isinstance(gone, (int, float)) else None
        return {
            "by": stop.get("configuration_name") or stop.get("rule"),
            "rule": stop.get("rule"),
            "step": stop.get("step"),
            "worker": stop.get("worker"),
            "message": stop.get("message"),
            "fix_hint": stop.get("fix_hint"),
            "delay_s": round(delay, 3) if delay is not None else None,
        }

    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        if self.status()[0] == "running":
            end: float | None = time.time()
        else:  # the moment training ended, as precisely as the run records it
            stop, exit_record = self.stop or {}, self.exit or {}
            end = exit_record.get("ended_at") or stop.get("stopped_at") or self.updated_at
        return max(0.0, float(end or time.time()) - self.started_at)

    def histogram_tensors(self, limit: int = 200) -> list[dict[str, Any]]:
        """Tensors with raw values (weights, gradients, outputs) and the recent steps they were saved at."""
        listing = self.listing
        if listing is None:
            return []
        collections = listing.collections
        weights = collections["weights"] if "weights" in collections else None
        losses = self.rules_losses()
        saved = listing.recent_steps()
        # weights first: the histogram users look for; then gradients and outputs
        names = sorted(
            (name for name in saved if name not in losses and not name.startswith(REDUCTION_PREFIX)),
            key=lambda name: (weights is None or not weights.matches(name), name),
        )
        return [{"name": name, "steps": saved[name]} for name in names[:limit]]

    def rules_losses(self) -> set[str]:
        listing = self.listing
        if listing is None or "losses" not in listing.collections:
            return set()
        losses = listing.collections["losses"]
        return {name for name in listing.recent_steps() if losses.matches(name)}

    def histogram(self, name: str, step: int, worker: str | None = None, bins: int = 40) -> dict[str, Any]:
        """Bin counts of one tensor at one step; NaN and inf counted apart (they have no bin)."""
        if self.listing is None:
            raise TrainguardError("the run has no tensors yet")
        with self._lock:
            value = self.listing.value(name, step, worker=worker)
        flat = np.asarray(value, dtype=np.float64).ravel()
        finite = flat[np.isfinite(flat)]
        counts, edges = np.histogram(finite, bins=bins) if finite.size else (np.zeros(0), np.zeros(0))
        return {
            "tensor": name, "step": step, "worker": worker, "size": int(flat.size),
            "edges": edges.tolist(), "counts": counts.astype(int).tolist(),
            "nan": int(np.isnan(flat).sum()),
            "posinf": int(np.isposinf(flat).sum()),
            "neginf": int(np.isneginf(flat).sum()),
        }  # fmt: skip


def _read_json(store: Store, key: str) -> dict[str, Any] | None:
    try:
        data = json.loads(store.read(key))
    except (TrainguardError, StorageError, ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def _profiler(sidecar: Store) -> dict[str, Any]:
    from trainguard.report.profiler_data import gather_profiler_sections

    try:
        sections = gather_profiler_sections(sidecar)
    except TrainguardError as error:
        return {"charts": [], "notes": [str(error)]}
    charts = []
    for chart in [*sections.system_charts, *sections.step_charts]:
        charts.append(
            {
                "id": chart.chart_id,
                "title": chart.title,
                "x_label": chart.x_label,
                "y_label": chart.y_label,
                "log_y": chart.log_y,
                "note": chart.note,
                "kind": chart.kind,
                "series": [{"label": s.label, "x": list(s.x), "y": list(s.y), "nonfinite": []} for s in chart.series],
            }
        )
    notes = [text for texts in sections.notes.values() for text in texts]
    return {"charts": charts, "notes": notes, "profiled": bool(charts)}
