"""The JSON documents the dashboard's pages read: the runs list, a run, its curves, a histogram.

The same documents feed ``trainguard ui`` (standard-library server), ``trainguard serve``'s
``/ui/`` (FastAPI) and ``trainguard report`` (inlined into one file), so the three show the same.
JSON has no NaN or infinity: non-finite numbers become ``null`` here, and the curves carry their
non-finite points as explicit markers (``"nonfinite": [[step, "nan"|"+inf"|"-inf"], ...]``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from trainguard.ui.live import LiveRun

__all__ = ["clean", "dumps", "run_detail", "run_series", "run_summary"]


def clean(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def dumps(document: Any) -> bytes:
    """Strict JSON (no NaN/Infinity tokens, which browsers' JSON.parse refuses)."""
    return json.dumps(clean(document), allow_nan=False, separators=(",", ":")).encode()


def run_summary(run: LiveRun) -> dict[str, Any]:
    """One row of the runs list."""
    status, status_text = run.status()
    arranged = run.rules.arranged
    loss = run.curves.latest_loss()
    return {
        "id": run.location.id,
        "name": run.location.name,
        "path": run.location.url,
        "status": status,
        "status_text": status_text,
        "started_at": run.started_at,
        "updated_at": run.updated_at,
        "duration_s": run.duration_s(),
        "steps": run.steps,
        "last_step": run.last_step,
        "workers": run.workers,
        "rules": arranged["counts"],
        "primary": arranged["primary_line"],
        "latest_loss": {"label": loss[0], "step": loss[1], "value": loss[2]} if loss else None,
        "problem": run.trial_error if run.listing is None else "",
    }


def run_detail(run: LiveRun) -> dict[str, Any]:
    """Everything the run page shows except the curves (which come with :func:`run_series`)."""
    arranged = run.rules.arranged
    stop = run.stop_view()
    marks = list(arranged["events"])
    if stop and isinstance(stop.get("step"), int):
        marks.append({"step": stop["step"], "label": f"stopped by {stop['by']}", "kind": "stop"})
    events = _merged(marks)
    return {
        **run_summary(run),
        "diagnosis": arranged["diagnosis"],
        "advice": arranged["advice"],
        "rules_table": arranged["rules"],
        "rule_problems": run.rules.problems,
        "stop": stop,
        "exit": run.exit,
        "events": events,
        "damaged": run.damaged[:50],
        "capture_stopped": run.capture_stopped,
        "tensors": run.histogram_tensors(),
        "profiler": run.profiler,
        "version": run.curves.version,
        "generated_at": time.time(),
    }


def _merged(marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per step (the stop's when there is one), its labels joined: several rules seeing
    the same step would otherwise draw their labels over each other."""
    by_step: dict[int, dict[str, Any]] = {}
    for mark in marks:
        line = by_step.setdefault(mark["step"], {"step": mark["step"], "labels": [], "kind": "finding"})
        label = mark["label"].replace(f" (step {mark['step']})", "")
        if label not in line["labels"]:
            line["labels"].append(label)
        if mark["kind"] == "stop":
            line["kind"] = "stop"
    return [
        {"step": step, "kind": line["kind"], "label": f"step {step}: " + ", ".join(line["labels"])}
        for step, line in sorted(by_step.items())
    ]


def run_series(run: LiveRun, since: int | None = None) -> dict[str, Any]:
    """The run's curves, or only ``{"version", "unchanged": true}`` when nothing was added since."""
    version = run.curves.version
    backlog = run.listing.backlog() if run.listing is not None else 0
    if since is not None and since == version:
        return {"version": version, "unchanged": True, "backlog": backlog}
    return {
        "version": version,
        "backlog": backlog,
        "cursor": run.curves.cursor,
        "charts": run.curves.charts(),
        "skipped": [{"step": step, "why": why} for step, why in sorted(run.curves.skipped.items())],
    }
