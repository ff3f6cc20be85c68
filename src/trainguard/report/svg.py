"""Charts drawn as inline SVG: no plotting library, nothing fetched when the report opens."""

from __future__ import annotations

import math
from html import escape

from trainguard.report.charts import Chart, Series

__all__ = ["PALETTE", "render_chart"]

# Colour-blind-friendly palette (Okabe–Ito plus extras); cycles for charts with more series.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
    "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF",
)  # fmt: skip

WIDTH, HEIGHT = 620, 270
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 12, 42
MAX_MARKED_POINTS = 40
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e5 or magnitude < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


class _Scale:
    """Data → pixel mapping for one axis, linear or log10."""

    def __init__(self, low: float, high: float, start: float, length: float, *, log: bool, flip: bool) -> None:
        self.log = log
        if log:
            low, high = math.log10(low), math.log10(high)
        if high == low:
            pad = abs(low) * 0.05 or 1.0
            low, high = low - pad, high + pad
        self.low, self.high, self.start, self.length, self.flip = low, high, start, length, flip

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        fraction = (v - self.low) / (self.high - self.low)
        return self.start + (1 - fraction if self.flip else fraction) * self.length

    def ticks(self) -> list[float]:
        if self.log:
            exponents = range(math.floor(self.low), math.ceil(self.high) + 1)
            ticks = [10.0**e for e in exponents if self.low - 1e-9 <= e <= self.high + 1e-9]
            return ticks or [10**self.low]
        return _nice_ticks(self.low, self.high)


def _series_points(chart: Chart) -> list[list[tuple[float, float]]]:
    """Per series, the drawable points (log charts drop values <= 0; histograms expand to steps)."""
    drawn = []
    for series in chart.series:
        if chart.kind == "histogram":
            drawn.append(_histogram_outline(series))
        else:
            points = series.finite_points()
            drawn.append([(x, y) for x, y in points if y > 0] if chart.log_y else points)
    return drawn


def _histogram_outline(series: Series) -> list[tuple[float, float]]:
    edges, counts = series.x, series.y
    if len(edges) != len(counts) + 1 or not counts:
        return []
    outline = [(edges[0], 0.0)]
    for left, right, count in zip(edges, edges[1:], counts, strict=False):
        outline += [(left, float(count)), (right, float(count))]
    outline.append((edges[-1], 0.0))
    return outline


def _path(points: list[tuple[float, float]], x_scale: _Scale, y_scale: _Scale) -> str:
    return "M" + " L".join(f"{x_scale(x):.1f},{y_scale(y):.1f}" for x, y in points)


def render_chart(chart: Chart) -> str:
    """The chart as an ``<svg>`` element, or a short paragraph when it has no data."""
    drawn = _series_points(chart)
    everything = [point for points in drawn for point in points]
    if not everything:
        return f'<p class="empty" id="{chart.chart_id}">{escape(chart.title)}: no data to plot.</p>'
    xs = [x for x, _ in everything]
    ys = [y for _, y in everything]
    y_low, y_high = min(ys), max(ys)
    if not chart.log_y and chart.kind == "histogram":
        y_low = 0.0
    x_scale = _Scale(min(xs), max(xs), LEFT, PLOT_W, log=False, flip=False)
    y_scale = _Scale(y_low, y_high, TOP, PLOT_H, log=chart.log_y, flip=True)
    parts = [
        f'<svg class="chart chart-{chart.kind}" id="{chart.chart_id}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'data-points="{chart.point_count()}" data-series="{len(chart.series)}">',
        f"<title>{escape(chart.title)}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" class="plot-area"/>',
    ]
    for tick in y_scale.ticks():
        y = y_scale(tick)
        if TOP - 0.5 <= y <= TOP + PLOT_H + 0.5:
            parts.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
            parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(tick)}</text>')
    for tick in x_scale.ticks():
        x = x_scale(tick)
        if LEFT - 0.5 <= x <= LEFT + PLOT_W + 0.5:
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + PLOT_H}" y2="{TOP + PLOT_H + 5}" class="axis"/>')
            parts.append(
                f'<text x="{x:.1f}" y="{TOP + PLOT_H + 18}" class="tick" text-anchor="middle">{_fmt(tick)}</text>'
            )
    parts.append(
        f'<text x="{LEFT + PLOT_W / 2:.0f}" y="{HEIGHT - 6}" class="axis-label" text-anchor="middle">'
        f"{escape(chart.x_label)}</text>"
    )
    y_label = chart.y_label + (" (log scale)" if chart.log_y else "")
    parts.append(
        f'<text transform="translate(14 {TOP + PLOT_H / 2:.0f}) rotate(-90)" class="axis-label" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    for index, (series, points) in enumerate(zip(chart.series, drawn, strict=True)):
        colour = PALETTE[index % len(PALETTE)]
        if points:
            parts.append(
                f'<path d="{_path(points, x_scale, y_scale)}" class="series" stroke="{colour}" '
                f'data-label="{escape(series.label)}" data-points="{len(points)}">'
                f"<title>{escape(series.label)}</title></path>"
            )
            if chart.kind == "line" and len(points) <= MAX_MARKED_POINTS:
                # Few points: mark each, so gaps (steps of another mode) do not read as data.
                parts.append(
                    f'<g class="markers" fill="{colour}">'
                    + "".join(f'<circle cx="{x_scale(x):.1f}" cy="{y_scale(y):.1f}" r="2.2"/>' for x, y in points)
                    + "</g>"
                )
        legend_y = TOP + 10 + index * 16
        if legend_y < HEIGHT - 10:
            label = series.label if len(series.label) <= 20 else series.label[:8] + "…" + series.label[-11:]
            parts.append(
                f'<line x1="{LEFT + PLOT_W + 10}" x2="{LEFT + PLOT_W + 26}" y1="{legend_y}" y2="{legend_y}" '
                f'stroke="{colour}" stroke-width="3"/>'
                f'<text x="{LEFT + PLOT_W + 30}" y="{legend_y + 4}" class="legend">{escape(label)}'
                f"<title>{escape(series.label)}</title></text>"
            )
    parts.append("</svg>")
    return "".join(parts)
