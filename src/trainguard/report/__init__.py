"""A self-contained HTML report of a run: ``trainguard report PATH -o report.html``.

>>> from trainguard.report import write_report
>>> write_report("runs/mnist", "report.html")

The file is the dashboard's run page (:mod:`trainguard.ui`) with its data and scripts inlined
(:mod:`trainguard.report.page`): the diagnosis and its fix, the stop, advice, the rules table,
curves with their NaN/inf markers and every worker, weight histograms at chosen steps, profiler
charts. It fetches nothing. :func:`gather_report` returns the same run's charts as plain data
(:class:`ReportData`), for programs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import MissingCollectionFiles, TrialError
from trainguard.report.findings import RuleOutcome, read_rule_outputs
from trainguard.report.page import ReportPage, build_page
from trainguard.report.profiler_data import ProfilerSections, gather_profiler_sections
from trainguard.report.tensors import TensorSections, gather_tensor_sections
from trainguard.storage import is_remote, open_store, sidecar_root
from trainguard.summary import format_bytes

__all__ = ["ReportData", "ReportPage", "build_page", "gather_report", "write_report"]


@dataclass
class ReportData:
    """Everything a report shows, gathered before any HTML is written."""

    path: str
    name: str
    overview: dict[str, Any] = field(default_factory=dict)
    tensor_error: str = ""
    tensors: TensorSections = field(default_factory=TensorSections)
    rule_outcomes: list[RuleOutcome] = field(default_factory=list)
    finding_problems: list[str] = field(default_factory=list)
    profiler: ProfilerSections = field(default_factory=ProfilerSections)
    generated_at: float = field(default_factory=time.time)
    read_seconds: float = 0.0


def _points_within_budget(overview: dict[str, Any], max_points: int, budget: int) -> int:
    per_step = int(overview["bytes"]) / max(1, int(overview["steps"]))
    if per_step * max_points <= budget:
        return max_points
    return max(10, int(budget // per_step))


def gather_report(
    path: str | os.PathLike[str],
    *,
    steps: Sequence[int] | None = None,
    endpoint_url: str | None = None,
    max_points: int = 200,
    read_budget_bytes: int = 2 * 2**30,
) -> ReportData:
    """Read a run (local directory or ``s3://bucket/prefix``) into :class:`ReportData`.

    Args:
        path: the hook's ``out_dir``.
        steps: global steps for the weight histograms (default: first, middle and last saved).
        endpoint_url: an S3-compatible endpoint for ``s3://`` paths.
        max_points: most steps read per norm / zero-fraction curve (long runs are subsampled).
        read_budget_bytes: fewer steps than ``max_points`` are read when the run's average bytes
            per step times ``max_points`` would exceed this (big models saving raw tensors).

    Raises:
        TrialError: the path holds no tensors, no rule results and no profiler data.
    """
    from trainguard.summary import describe_run
    from trainguard.trial import create_trial

    started = time.monotonic()
    text = os.fspath(path)
    options: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url and is_remote(text) else {}
    data = ReportData(path=text, name=text.rstrip("/").rsplit("/", 1)[-1] or text)
    try:
        trial = create_trial(text, collection_wait_timeout=0, **options)
    except MissingCollectionFiles as error:
        data.tensor_error = f"No tensors: {error}"
    else:
        data.overview = describe_run(trial)
        points = _points_within_budget(data.overview, max_points, read_budget_bytes)
        data.tensors = gather_tensor_sections(trial, histogram_steps=steps, max_points=points)
        if points < max_points:
            data.tensors.note(
                "norms",
                f"Curves read {points} of the saved steps: the run averages "
                f"{format_bytes(int(data.overview['bytes']) // max(1, int(data.overview['steps'])))} per step "
                f"and the report reads at most {format_bytes(read_budget_bytes)}.",
            )

    sidecar = open_store(sidecar_root(text), **options)
    data.rule_outcomes, data.finding_problems = read_rule_outputs(sidecar)
    data.profiler = gather_profiler_sections(sidecar)
    if (
        not data.overview
        and not data.rule_outcomes
        and not data.profiler.system_charts
        and not data.profiler.step_charts
    ):
        raise TrialError(
            f"nothing to report at {text}: {data.tensor_error or 'no tensors'}, "
            "no rule-output/*.json, no profiler-output/"
        )
    data.read_seconds = time.monotonic() - started
    return data


def write_report(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] = "report.html",
    *,
    steps: Sequence[int] | None = None,
    endpoint_url: str | None = None,
    max_points: int = 600,
) -> ReportPage:
    """Render the run at ``path`` (see :func:`build_page`) and write it to ``output`` (a local file)."""
    page = build_page(os.fspath(path), steps=steps, endpoint_url=endpoint_url, max_points=max_points)
    target = Path(output)
    if target.parent != Path(""):
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page.html, encoding="utf-8")
    return page
