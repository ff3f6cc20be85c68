"""Series kept at bounded size however long the run: min/max per bucket of steps.

A chart cannot show more points than it has pixels, and the server must not hold a 1M-step run
in memory, so each series keeps at most ``max_buckets`` buckets of consecutive steps. A bucket
keeps its lowest and highest finite value (with their steps), so spikes survive downsampling.
Non-finite values (NaN, +inf, -inf) are never averaged away: every bucket that held one keeps a
marker of each kind, drawn by the page at its step.

Buckets are keyed by ``step // width``, so points may arrive in any order; when the bucket count
passes ``max_buckets`` the width doubles and neighbouring buckets merge. The point with the
highest step is always kept as well: a live chart must end at the latest value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BoundedSeries", "nonfinite_kind"]


def nonfinite_kind(value: float) -> str:
    """ "nan", "+inf", "-inf", or "" for a finite value."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return ""


@dataclass
class _Bucket:
    low_x: float
    low: float
    high_x: float
    high: float

    def add(self, x: float, y: float) -> None:
        if y < self.low or (y == self.low and x < self.low_x):
            self.low_x, self.low = x, y
        if y > self.high or (y == self.high and x > self.high_x):
            self.high_x, self.high = x, y

    def merge(self, other: _Bucket) -> None:
        self.add(other.low_x, other.low)
        self.add(other.high_x, other.high)


class BoundedSeries:
    """One line of a chart: ``add(step, value)`` in any order; ``points()`` for drawing."""

    def __init__(self, max_buckets: int = 600) -> None:
        if max_buckets < 2:
            raise ValueError("max_buckets must be at least 2")
        self.max_buckets = max_buckets
        self.width = 1
        self._buckets: dict[int, _Bucket] = {}
        self._nonfinite: dict[int, dict[str, float]] = {}  # bucket -> kind -> first step seen
        self.count = 0  # points added, finite or not
        self._latest: tuple[float, float] | None = None  # the finite point with the highest step

    def add(self, x: float, y: float) -> None:
        self.count += 1
        key = int(x) // self.width
        kind = nonfinite_kind(y)
        if kind:
            kinds = self._nonfinite.setdefault(key, {})
            kinds[kind] = min(kinds.get(kind, x), x)
        else:
            if self._latest is None or x >= self._latest[0]:
                self._latest = (x, y)
            bucket = self._buckets.get(key)
            if bucket is None:
                self._buckets[key] = _Bucket(x, y, x, y)
            else:
                bucket.add(x, y)
        while len(self._buckets) + len(self._nonfinite) > 2 * self.max_buckets or len(self._buckets) > self.max_buckets:
            self._coarsen()

    def _coarsen(self) -> None:
        self.width *= 2
        buckets: dict[int, _Bucket] = {}
        for key, bucket in self._buckets.items():
            merged = buckets.get(key // 2)
            if merged is None:
                buckets[key // 2] = bucket
            else:
                merged.merge(bucket)
        nonfinite: dict[int, dict[str, float]] = {}
        for key, kinds in self._nonfinite.items():
            target = nonfinite.setdefault(key // 2, {})
            for kind, x in kinds.items():
                target[kind] = min(target.get(kind, x), x)
        self._buckets, self._nonfinite = buckets, nonfinite

    def points(self) -> tuple[list[float], list[float]]:
        """Finite points in step order: each bucket's low and high (one point when they coincide)."""
        xs: list[float] = []
        ys: list[float] = []
        for key in sorted(self._buckets):
            bucket = self._buckets[key]
            pairs = sorted({(bucket.low_x, bucket.low), (bucket.high_x, bucket.high)})
            for x, y in pairs:
                xs.append(x)
                ys.append(y)
        if self._latest is not None and (not xs or xs[-1] < self._latest[0]):
            xs.append(self._latest[0])
            ys.append(self._latest[1])
        return xs, ys

    def markers(self) -> list[tuple[float, str]]:
        """``(step, kind)`` of the non-finite values: the first of each kind in each bucket."""
        return sorted((x, kind) for kinds in self._nonfinite.values() for kind, x in kinds.items())

    def last(self) -> tuple[float, float] | None:
        """The point with the highest step (finite or not), for the list page's latest value."""
        best: tuple[float, float] | None = None
        for bucket in self._buckets.values():
            for x, y in ((bucket.low_x, bucket.low), (bucket.high_x, bucket.high)):
                if best is None or x > best[0]:
                    best = (x, y)
        for kinds in self._nonfinite.values():
            for kind, x in kinds.items():
                if best is None or x > best[0]:
                    best = (x, {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf}[kind])
        return best

    def to_json(self) -> dict[str, object]:
        xs, ys = self.points()
        return {"x": xs, "y": ys, "nonfinite": [[x, kind] for x, kind in self.markers()], "width": self.width}
