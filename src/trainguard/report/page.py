"""``trainguard report``'s file: the dashboard's run page, with its data and code inlined.

The same documents the live dashboard fetches (:mod:`trainguard.ui.views`: the run, its curves,
histograms of the weights at chosen steps) are embedded as JSON in a ``<script
type="application/json">`` block, and the same scripts (uPlot, ``common.js``, ``run.js``) and
styles are inlined. A file cannot say ``'self'``, so the page's Content-Security-Policy allows
exactly those inline blocks by their SHA-256 and nothing else: no request leaves the page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.errors import TrialError
from trainguard.storage import is_remote
from trainguard.ui.discover import RunLocation
from trainguard.ui.live import LiveRun
from trainguard.ui.server import static_file
from trainguard.ui.views import clean, run_detail, run_series

__all__ = ["ReportPage", "build_page"]

MAX_HISTOGRAM_TENSORS = 24
_SCRIPTS = ("vendor/uplot/uPlot.iife.min.js", "common.js", "run.js")
_STYLES = ("vendor/uplot/uPlot.min.css", "app.css")


@dataclass
class ReportPage:
    html: str
    rules: int
    findings: int
    nonfinite_markers: int
    read_seconds: float


def _text(relative: str) -> str:
    found = static_file(relative)
    assert found is not None, f"the package ships static/{relative}"
    return found[0].decode("utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def _histogram_steps(available: Sequence[int], requested: Sequence[int] | None) -> list[int]:
    """First, middle and last saved step; requested steps snap to the nearest saved one."""
    ordered = sorted(set(available))
    if not ordered:
        return []
    if not requested:
        return sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]})
    return sorted({min(ordered, key=lambda saved: (abs(saved - step), saved)) for step in requested})


def _notes(run: LiveRun, series: dict[str, Any]) -> list[str]:
    """The sentences the page lists under "Damaged files": what is left out, and why."""
    notes = [
        f"Step {item['step']} is left out of every chart: its data is damaged ({item['why']})."
        for item in series["skipped"]
    ]
    notes += [f"{item['file']}: {item['problem']}" for item in run.damaged]
    notes += [
        f"Capture stopped early: {record.get('worker', 'worker_0')} captured nothing "
        f"from step {record.get('step')} on: {record.get('reason')}"
        for record in run.capture_stopped
    ]
    return notes


def build_page(
    path: str,
    *,
    endpoint_url: str | None = None,
    steps: Sequence[int] | None = None,
    max_points: int = 600,
) -> ReportPage:
    """Read the run at ``path`` to its end and render its page (see the module docstring).

    Raises:
        TrialError: the path holds no tensors, no rule results and no profiler data.
    """
    started = time.monotonic()
    options = {"endpoint_url": endpoint_url} if endpoint_url and is_remote(path) else {}
    location = RunLocation(path.rstrip("/") if is_remote(path) else path, options)
    run = LiveRun(location, budget_s=float("inf"))
    run.curves.max_buckets = max(2, max_points // 2)  # a bucket draws at most two points
    run.refresh(force=True)
    if run.trial is None and not run.rules.results and not run.profiler.get("charts"):
        raise TrialError(
            f"nothing to report at {path}: {run.trial_error or 'no tensors'}, "
            "no rule-output/*.json, no profiler-output/"
        )
    detail = run_detail(run)
    series = run_series(run)
    documents: dict[str, Any] = {"run_id": location.id, "histograms": True}
    base = f"api/runs/{location.id}"
    tensors = []
    for tensor in detail["tensors"][:MAX_HISTOGRAM_TENSORS]:
        chosen = _histogram_steps(tensor["steps"], steps)
        kept = []
        for step in chosen:
            try:
                histogram = run.histogram(tensor["name"], step)
            except Exception:  # noqa: BLE001, S112 - a damaged step: that histogram is left out
                continue
            query = urllib.parse.urlencode(
                {"tensor": tensor["name"], "step": step}, quote_via=urllib.parse.quote, safe=""
            )
            documents[f"{base}/histogram?{query}"] = histogram
            kept.append(step)
        if kept:
            tensors.append({"name": tensor["name"], "steps": kept})
    detail["tensors"] = tensors
    detail["notes"] = _notes(run, series)
    documents[base] = detail
    documents[f"{base}/series"] = series
    page = _render(detail["name"], documents)
    findings = sum(row["findings"] for row in detail["rules_table"])
    markers = sum(len(line["nonfinite"]) for chart in series["charts"] for line in chart["series"])
    return ReportPage(page, len(detail["rules_table"]), findings, markers, time.monotonic() - started)


def _render(name: str, documents: dict[str, Any]) -> str:
    template = _text("run.html")
    data = json.dumps(clean(documents), allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    scripts = [_text(relative) for relative in _SCRIPTS]
    assert not any("</script" in text.lower() for text in scripts), "an inlined script must not end its block"
    styles = [_text(relative) for relative in _STYLES]
    policy = (
        "default-src 'none'; script-src " + " ".join(_sha256(text) for text in scripts)
        + "; style-src " + " ".join(_sha256(text) for text in styles)
        + "; img-src data:; base-uri 'none'; form-action 'none'"
    )  # fmt: skip
    # the page's own <link>/<script src> tags give way to the inlined blocks
    tags = r'\s*<link rel="stylesheet"[^>]*>|\s*<script src="[^"]*" defer></script>'
    head = re.sub(tags, "", template.split("</head>")[0])
    head = head.replace("trainguard · run", f"trainguard · {html.escape(name)}")
    head += f'\n<meta http-equiv="Content-Security-Policy" content="{policy}">'
    head += "".join(f"\n<style>{text}</style>" for text in styles)
    body = template.split("</head>", 1)[1].replace('<a href="./">← all runs</a>', '<span class="muted">report</span>')
    inline = "".join(f"\n<script>{text}</script>" for text in scripts)
    body = body.replace("</body>", f'<script type="application/json" id="tg-data">{data}</script>{inline}\n</body>')
    return head.replace("<!doctype html>", "<!DOCTYPE html>", 1) + "\n</head>" + body
