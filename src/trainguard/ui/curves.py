"""The curves of one run, read incrementally: a cursor per run, each step read once.

``RunCurves.update(listing)`` reads only the complete steps after its cursor (within a time
budget, so a first look at a long finished run comes back quickly and fills in over the next
refreshes), through :class:`~trainguard.ui.listing.RunListing` (whole index and event files,
each step once, then forgotten), and adds each value to a
:class:`~trainguard.ui.downsample.BoundedSeries`. Memory is bounded by the number of series and
their bucket cap, not by the run's length. What is drawn:

* losses and metrics (``losses``, ``scalars``, ``metrics``, ``sm_metrics``): mean value, one
  series per tensor, mode and worker;
* per-layer weight and gradient L2 norms (raw values or saved ``l2`` reductions);
* update ratio per layer, ``||w_t - w_prev|| / ||w_prev||`` between consecutive saved steps with
  raw weights (the previous raw weights are kept, up to ``max_update_bytes``: a model larger than
  that gets no update-ratio chart, and the page says so);
* dead fraction of ReLU outputs (share of exact zeros) and saturated fraction of tanh / sigmoid
  outputs (share with ``|tanh| >= 0.99`` / sigmoid outside ``[0.01, 0.99]``; the rules' own
  thresholds are in their docstrings, this is a display of the share only).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from trainguard.ui.downsample import BoundedSeries
from trainguard.ui.listing import RunListing

__all__ = ["CHART_GROUPS", "RunCurves"]

logger = logging.getLogger("trainguard")

REDUCTION_PREFIX = "smdebug/reductions/"
SCALAR_COLLECTIONS = ("losses", "scalars", "metrics", "sm_metrics")
# group -> (title, y label): the order the run page shows them in
CHART_GROUPS: dict[str, tuple[str, str]] = {
    "losses": ("Losses", "loss"),
    "metrics": ("Metrics", "value"),
    "weight_norms": ("Weight L2 norm per layer", "L2 norm"),
    "gradient_norms": ("Gradient L2 norm per layer", "L2 norm"),
    "update_ratios": ("Update ratio per layer", "||Δw|| / ||w||"),
    "dead_fraction": ("Dead ReLU fraction per layer", "fraction of zeros"),
    "saturated_fraction": ("Saturated tanh/sigmoid fraction per layer", "fraction saturated"),
}
_COLLECTION_ROLES = (
    ("losses", "losses"),
    ("scalars", "metrics"),
    ("metrics", "metrics"),
    ("sm_metrics", "metrics"),
    ("weights", "weights"),
    ("gradients", "gradients"),
    ("relu_output", "relu"),
    ("tanh_output", "tanh"),
    ("sigmoid_output", "sigmoid"),
)


@dataclass
class _Line:
    group: str
    label: str
    series: BoundedSeries


@dataclass
class RunCurves:
    """Every curve of one run; ``update`` moves the cursor forward, ``charts`` draws."""

    max_buckets: int = 600
    max_update_bytes: int = 256 * 2**20
    cursor: int = -1  # highest global step read
    version: int = 0  # changes whenever a point is added
    lines: dict[tuple[str, str], _Line] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    _roles: dict[str, str] = field(default_factory=dict)
    _roles_of: int = 0
    _previous: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    _previous_bytes: int = 0
    _workers: int = 1

    def _role(self, listing: RunListing, name: str) -> str:
        collections = listing.collections
        if id(collections) != self._roles_of:  # the hook added tensors to a collection mid-run
            self._roles, self._roles_of = {}, id(collections)
        role = self._roles.get(name)
        if role is None:
            role = ""
            for collection, candidate in _COLLECTION_ROLES:
                if collection in collections and collections[collection].matches(name):
                    role = candidate
                    break
            self._roles[name] = role
        return role

    def _add(self, group: str, label: str, step: int, value: float) -> None:
        key = (group, label)
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _Line(group, label, BoundedSeries(self.max_buckets))
        line.series.add(float(step), value)
        self.version += 1

    def update(self, listing: RunListing, *, budget_s: float = 0.5) -> int:
        """Read the complete steps after the cursor, for at most about ``budget_s``; return how many
        (step, worker) pairs were read."""
        self._workers = max(1, len(listing.workers))

        def wanted(name: str) -> bool:
            base = name
            if name.startswith(REDUCTION_PREFIX):
                reduction, _, base = name[len(REDUCTION_PREFIX) :].partition("/")
                if reduction not in ("l2", "zero_fraction"):
                    return False
            return bool(self._role(listing, base))

        read = 0
        for item in listing.read(wanted, budget_s=budget_s):
            read += 1
            self.cursor = max(self.cursor, item.step)
            if item.error:
                if item.step not in self.skipped:
                    self.skipped[item.step] = item.error
                    logger.warning("trainguard: step %d is left out of the charts: %s", item.step, item.error)
                continue
            for name, value in item.values.items():
                base = name[len(REDUCTION_PREFIX) :].partition("/")[2] if name.startswith(REDUCTION_PREFIX) else name
                self._record(self._role(listing, base), base, name != base, item.mode, item.worker, item.step, value)
        if listing.last_step is not None and not listing.backlog():
            self.cursor = max(self.cursor, listing.last_step)  # steps with nothing to draw count as read
        return read

    def backlog(self, listing: RunListing) -> int:
        return listing.backlog()

    def _label(self, name: str, mode: str | None, worker: str) -> str:
        parts = [name]
        if mode is not None:
            parts.append(mode)
        if self._workers > 1:
            parts.append(worker)
        return " · ".join(parts)

    def _record(
        self, role: str, name: str, reduced: bool, mode: str, worker: str, step: int, value: np.ndarray
    ) -> None:
        array = np.asarray(value)
        if role in ("losses", "metrics"):
            self._add(role, self._label(name, mode, worker), step, _mean(array))
        elif role in ("weights", "gradients"):
            group = "weight_norms" if role == "weights" else "gradient_norms"
            norm = float(array) if reduced else _l2(array)
            self._add(group, self._label(name, None, worker), step, norm)
            if role == "weights" and not reduced:
                self._update_ratio(name, worker, step, array)
        elif role == "relu":
            fraction = float(array) if reduced else _share(array == 0, array)
            self._add("dead_fraction", self._label(name, None, worker), step, fraction)
        elif role in ("tanh", "sigmoid") and not reduced:
            if role == "tanh":
                saturated = np.abs(array) >= 0.99
            else:
                saturated = (array <= 0.01) | (array >= 0.99)
            self._add("saturated_fraction", self._label(name, None, worker), step, _share(saturated, array))

    def _update_ratio(self, name: str, worker: str, step: int, array: np.ndarray) -> None:
        key = (name, worker)
        current = array.astype(np.float64, copy=False)
        previous = self._previous.get(key)
        if previous is not None and previous.shape == current.shape:
            base = _l2(previous)
            ratio = _l2(current - previous) / base if base > 0 else math.nan
            self._add("update_ratios", self._label(name, None, worker), step, ratio)
            self._previous_bytes -= previous.nbytes
        if self._previous_bytes + current.nbytes > self.max_update_bytes:
            self._previous.pop(key, None)
            self.notes["update_ratios"] = (
                f"update ratios are drawn for the layers whose previous weights fit in "
                f"{self.max_update_bytes // 2**20} MiB of the server's memory"
            )
            return
        self._previous[key] = np.array(current, copy=True)
        self._previous_bytes += current.nbytes

    def charts(self, groups: Iterable[str] = CHART_GROUPS) -> list[dict[str, object]]:
        """One chart per group that has data; every series with its full label."""
        charts = []
        for group in groups:
            lines = sorted((line for line in self.lines.values() if line.group == group), key=lambda line: line.label)
            if not lines:
                continue
            title, y_label = CHART_GROUPS[group]
            charts.append(
                {
                    "id": f"chart-{group.replace('_', '-')}",
                    "group": group,
                    "title": title,
                    "y_label": y_label,
                    "x_label": "global step",
                    "log_y": group in ("weight_norms", "gradient_norms", "update_ratios") and _spread(lines) > 100,
                    "note": self.notes.get(group, ""),
                    "series": [{"label": line.label, **line.series.to_json()} for line in lines],
                }
            )
        return charts

    def latest_loss(self) -> tuple[str, float, float] | None:
        """The last loss point (label, step, value), for the list page."""
        best = None
        for line in self.lines.values():
            if line.group != "losses":
                continue
            last = line.series.last()
            if last is not None and (best is None or last[0] > best[1]):
                best = (line.label, last[0], last[1])
        return best


def _mean(array: np.ndarray) -> float:
    if array.size == 0:
        return math.nan
    with np.errstate(all="ignore"):
        return float(np.mean(array.astype(np.float64, copy=False)))


def _l2(array: np.ndarray) -> float:
    flat = array.astype(np.float64, copy=False).ravel()
    with np.errstate(all="ignore"):  # what np.linalg.norm computes for a real vector, without its checks
        return math.sqrt(float(np.dot(flat, flat)))


def _share(mask: np.ndarray, array: np.ndarray) -> float:
    return float(np.count_nonzero(mask)) / array.size if array.size else math.nan


def _spread(lines: list[_Line]) -> float:
    positive = [y for line in lines for y in line.series.points()[1] if y > 0]
    if not positive or any(y <= 0 for line in lines for y in line.series.points()[1]):
        return 1.0
    return max(positive) / min(positive)
