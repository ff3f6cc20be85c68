"""What a report plots, as plain data: a chart is a title, axis labels and named series.

Kept apart from the SVG drawing so that tests can compare the numbers a report shows with the
numbers the trial returns, without parsing SVG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Chart", "Series"]


@dataclass
class Series:
    """One line (``x``/``y`` points) or one histogram (``x`` = bin edges, ``y`` = counts, one fewer)."""

    label: str
    x: list[float]
    y: list[float]

    def finite_points(self) -> list[tuple[float, float]]:
        return [(x, y) for x, y in zip(self.x, self.y, strict=False) if math.isfinite(x) and math.isfinite(y)]


@dataclass
class Chart:
    """A line chart (``kind="line"``) or an outlined histogram (``kind="histogram"``)."""

    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    kind: str = "line"
    log_y: bool = False
    note: str = ""

    @property
    def chart_id(self) -> str:
        """A stable DOM id, so tests and readers can find a chart by its title."""
        slug = "".join(ch if ch.isalnum() else "-" for ch in self.title.lower())
        return "chart-" + "-".join(part for part in slug.split("-") if part)

    def point_count(self) -> int:
        return sum(len(series.finite_points()) for series in self.series)

    def is_empty(self) -> bool:
        return self.point_count() == 0
