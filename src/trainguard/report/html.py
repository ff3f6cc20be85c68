"""The report page: one self-contained HTML file (inline CSS and SVG, no scripts, no fetches).

A Content-Security-Policy meta tag forbids every network source, so even a browser that would
try to fetch something (a font, a favicon) is stopped: the file opens the same offline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from trainguard.report.charts import Chart
from trainguard.report.findings import RuleOutcome
from trainguard.report.svg import render_chart
from trainguard.rules.diagnosis import diagnose, names_workers
from trainguard.summary import format_bytes

_NOT_EVALUATED = "RuleNotEvaluated:"

if TYPE_CHECKING:
    from trainguard.report import ReportData

__all__ = ["render_html"]

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1b1f24; background: #f6f7f9; }
header { background: #1f3b57; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 0; opacity: .85; }
nav { padding: 8px 28px; background: #e8ecf1; position: sticky; top: 0; z-index: 1; }
nav a { margin-right: 14px; color: #1f3b57; text-decoration: none; font-weight: 600; }
main { padding: 8px 28px 40px; }
section { background: #fff; border: 1px solid #dde2e8; border-radius: 6px; margin: 16px 0; padding: 6px 18px 16px; }
h2 { font-size: 18px; margin: 12px 0 8px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border-bottom: 1px solid #e3e7ec; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f0f3f6; }
.charts { display: flex; flex-wrap: wrap; gap: 10px; }
figure { margin: 0; }
.chart-title { font-weight: 600; margin: 6px 0 2px; }
figcaption { font-size: 12px; color: #57606a; max-width: 620px; }
svg.chart { background: #fff; max-width: 100%; height: auto; }
svg .plot-area { fill: #fbfcfd; stroke: #c9d1d9; }
svg .grid { stroke: #e6e9ed; }
svg .axis { stroke: #8b949e; }
svg .tick, svg .legend { font-size: 11px; fill: #424a53; }
svg .axis-label { font-size: 12px; fill: #24292f; }
svg .series { fill: none; stroke-width: 1.8; stroke-linejoin: round; }
.empty { color: #6e7781; font-style: italic; }
.note { color: #6e7781; margin: 4px 0; }
.status { font-weight: 700; padding: 1px 6px; border-radius: 4px; }
.status-IssuesFound { background: #ffebe9; color: #a40e26; }
.status-NoIssuesFound { background: #dafbe1; color: #116329; }
.status-NotEvaluated { background: #fff1c2; color: #7d4e00; }
.diagnosis { border-left: 4px solid #a40e26; padding: 4px 12px; margin: 8px 0 16px; background: #fff8f7; }
.diagnosis.none { border-left-color: #116329; background: #f6fff8; }
.status-Error { background: #fff1c2; color: #7d4e00; }
.status-InProgress, .status-Stopping, .status-Stopped, .status-Unknown { background: #eaeef2; color: #424a53; }
.hint { color: #0b5cad; }
code { font-size: 12.5px; }
"""

MAX_FINDINGS_PER_RULE = 25  # the first ones of each rule; the status table has the counts

SECTIONS = (
    ("overview", "Overview"),
    ("findings", "Rule findings"),
    ("scalars", "Losses and metrics"),
    ("norms", "Weight and gradient norms"),
    ("histograms", "Weight distributions"),
    ("activations", "Activations"),
    ("system", "System metrics"),
    ("steps", "Step times"),
)


def _notes(lines: Sequence[str]) -> str:
    return "".join(f'<p class="note">{escape(line)}</p>' for line in lines)


def _figures(charts: Sequence[Chart]) -> str:
    items = []
    for chart in charts:
        caption = f"<figcaption>{escape(chart.note)}</figcaption>" if chart.note else ""
        items.append(
            f'<figure><div class="chart-title">{escape(chart.title)}</div>{render_chart(chart)}{caption}</figure>'
        )
    return f'<div class="charts">{"".join(items)}</div>'


def _charts_or_empty(charts: Sequence[Chart], empty: str) -> str:
    drawable = [chart for chart in charts if not chart.is_empty()]
    return _figures(drawable) if drawable else f'<p class="empty">{escape(empty)}</p>'


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], css: str = "") -> str:
    head = "<thead><tr>" + "".join(f"<th>{escape(cell)}</th>" for cell in header) + "</tr></thead>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}">{head}<tbody>{body}</tbody></table>'


def _overview(data: ReportData) -> str:
    facts = data.overview
    if not facts:
        return f'<p class="empty">{escape(data.tensor_error or "No tensors were read.")}</p>'
    modes = ", ".join(f"{mode}: {count}" for mode, count in facts["steps_per_mode"].items()) or "none"
    collections = ", ".join(f"{name} {count}" for name, count in facts["tensors_per_collection"].items()) or "none"
    rows = [
        ("Run", f"<code>{escape(str(facts['path']))}</code>"),
        ("Workers", escape(", ".join(facts["workers"]) or "none")),
        ("Steps saved", f"{facts['steps']} (global steps {facts['first_step']}..{facts['last_step']})"),
        ("Steps per mode", escape(modes)),
        (
            "Tensors",
            f"{facts['tensors']} ({escape(collections)})"
            + (f" + {facts['reduction_tensors']} saved reductions" if facts["reduction_tensors"] else ""),
        ),
        ("Data", escape(format_bytes(int(facts["bytes"])))),
        ("Training ended", "yes" if facts["ended"] else "no (live or crashed run)"),
    ]
    if len(facts["workers"]) > 1:
        rows.append(("Plots show", f"worker {escape(facts['workers'][0])} (the first one)"))
    for worker, why in (facts.get("capture_stopped") or {}).items():
        rows.append(
            ("Capture stopped early",
             escape(f"{worker} captured nothing from step {why.get('step')} on: {why.get('reason')}"))
        )  # fmt: skip
    for item in facts.get("damaged") or []:
        where = "" if item.get("step") is None else f"step {item['step']} of {item.get('worker')}: "
        rows.append(("Damaged", escape(f"{where}{item.get('file')}: {item.get('problem')}")))
    return _table(None, [(f"<b>{escape(k)}</b>", v) for k, v in rows], "overview")


def _status_label(outcome: RuleOutcome) -> str:
    """The status as shown: "NotEvaluated" for an Error that says the rule could not evaluate."""
    if outcome.status == "Error" and outcome.status_details.lstrip().startswith(_NOT_EVALUATED):
        return "NotEvaluated"
    return outcome.status


def _status_badge(outcome: RuleOutcome) -> str:
    label = _status_label(outcome)
    text = "not evaluated" if label == "NotEvaluated" else label
    return f'<span class="status status-{escape(label)}">{escape(text)}</span>'


def _diagnosis(data: ReportData) -> str:
    """The run's diagnosis (see trainguard.rules.diagnosis): what the report leads with."""
    if not data.rule_outcomes:
        return ""
    results = [
        {"configuration_name": o.configuration_name, "rule": o.rule, "status": o.status,
         "status_details": o.status_details, "findings": o.findings}
        for o in data.rule_outcomes
    ]  # fmt: skip
    diagnosis = diagnose(results)
    show_workers = names_workers(f for key in ("primary", "consequences", "other") for f in diagnosis[key])

    def where(finding: dict) -> str:
        workers = finding.get("workers") or ([finding["worker"]] if finding.get("worker") else [])
        on = f" on {', '.join(workers)}" if show_workers and workers else ""
        return f"step {finding.get('step')}{on}"

    parts = []
    for finding in diagnosis["primary"]:
        certainty = "" if finding.get("certain") else " (not certain)"
        parts.append(
            f"<p><b>Diagnosis: {escape(str(finding.get('rule')))}</b> at {escape(where(finding))}"
            f"{escape(certainty)}: {escape(str(finding.get('message') or ''))}</p>"
        )
        if finding.get("fix_hint"):
            parts.append(f'<p class="hint"><b>Fix:</b> {escape(str(finding["fix_hint"]))}</p>')
    explained = [
        f"<li>{escape(str(f.get('rule')))} at {escape(where(f))}: {escape(str(f.get('why') or ''))}</li>"
        for f in diagnosis["consequences"]
    ]
    if explained:
        parts.append(f"<p>It explains:</p><ul>{''.join(explained)}</ul>")
    others = [
        f"<li>{escape(str(f.get('rule')))} at {escape(where(f))}: {escape(str(f.get('message') or ''))}</li>"
        for f in diagnosis["other"]
    ]
    if others:
        parts.append(f"<p>Other findings:</p><ul>{''.join(others)}</ul>")
    unevaluated = [
        f"<li>{escape(str(item.get('rule')))}: {escape(str(item.get('reason') or ''))}</li>"
        for item in diagnosis["not_evaluated"]
    ]
    if unevaluated:
        parts.append(f"<p>Not evaluated (these rules could not check this run):</p><ul>{''.join(unevaluated)}</ul>")
    if not diagnosis["primary"]:
        parts.insert(0, "<p><b>No rule found an issue.</b></p>")
        return f'<div class="diagnosis none">{"".join(parts)}</div>'
    return f'<div class="diagnosis">{"".join(parts)}</div>'


def _findings(data: ReportData) -> str:
    parts = [_notes(data.finding_problems)]
    if not data.rule_outcomes:
        parts.append('<p class="empty">No rule results: no rule-output/*.json files in this run.</p>')
        return "".join(parts)
    status_rows = [
        (
            escape(outcome.configuration_name),
            escape(outcome.rule),
            _status_badge(outcome),
            escape("" if outcome.last_evaluated_step is None else str(outcome.last_evaluated_step)),
            str(len(outcome.fired)),
            escape(outcome.status_details.strip()),
        )
        for outcome in data.rule_outcomes
    ]
    parts.append(
        _table(("Rule configuration", "Rule", "Status", "Last step", "Findings", "Details"), status_rows, "rules")
    )
    finding_rows, left_out = [], []
    for outcome in data.rule_outcomes:
        fired = outcome.fired
        hidden = len(fired) - MAX_FINDINGS_PER_RULE + outcome.dropped_findings
        if hidden > 0:
            left_out.append(f"{outcome.configuration_name}: {hidden} more finding(s) not listed")
        for finding in fired[:MAX_FINDINGS_PER_RULE]:
            finding_rows.append(
                (
                    escape(finding.get("rule") or outcome.rule),
                    _status_badge(outcome),
                    escape(str(finding.get("step", ""))),
                    escape(str(finding.get("worker") or "")),
                    escape(str(finding.get("message", ""))),
                    f'<span class="hint">{escape(str(finding.get("fix_hint", "")))}</span>',
                )
            )
    if finding_rows:
        parts.append(f"<h3>Findings ({len(finding_rows)})</h3>")
        parts.append(_table(("Rule", "Status", "Step", "Worker", "What was found", "How to fix"), finding_rows, "findings"))
        parts.append(_notes(left_out))
    else:
        parts.append('<p class="empty">No rule fired.</p>')
    missing_rows = [
        (
            escape(outcome.configuration_name),
            escape(str(item.get("what", ""))),
            escape(str(item.get("collection") or "")),
        )
        for outcome in data.rule_outcomes
        for item in outcome.missing
    ]
    if missing_rows:
        parts.append("<h3>Data the rules needed and did not find</h3>")
        parts.append(_table(("Rule configuration", "Missing", "Collection to save"), missing_rows, "missing"))
    return "".join(parts)


def _step_stats(data: ReportData) -> str:
    if not data.profiler.step_stats:
        return ""
    rows = [
        (escape(str(s["series"])), str(s["steps"]), f"{s['median_ms']:.1f}", f"{s['p95_ms']:.1f}", f"{s['max_ms']:.1f}")
        for s in data.profiler.step_stats
    ]
    return _table(("Series", "Steps", "Median ms", "p95 ms", "Max ms"), rows, "step-stats")


def render_html(data: ReportData) -> str:
    """The whole report page."""
    tensors, profiler = data.tensors, data.profiler
    norm_charts = tensors.weight_norm_charts + tensors.bias_norm_charts + tensors.gradient_norm_charts
    histogram_steps = ", ".join(str(step) for step in tensors.histogram_steps)
    bodies = {
        "overview": _diagnosis(data) + _notes(tensors.notes.get("overview", [])) + _overview(data),
        "findings": _findings(data),
        "scalars": _notes(tensors.notes.get("scalars", []))
        + _charts_or_empty(tensors.scalar_charts, "No losses or metrics to plot."),
        "norms": _notes(tensors.notes.get("norms", []))
        + _charts_or_empty(norm_charts, "No weights, biases or gradients to plot."),
        "histograms": (f'<p class="note">At global steps {escape(histogram_steps)}.</p>' if histogram_steps else "")
        + _notes(tensors.notes.get("histograms", []))
        + _charts_or_empty(tensors.histogram_charts, "No weight distributions to plot."),
        "activations": _notes(tensors.notes.get("activations", []))
        + _charts_or_empty(tensors.activation_charts, "No activation zero fractions to plot."),
        "system": _notes(profiler.notes.get("system", []))
        + _charts_or_empty(profiler.system_charts, "No system metrics to plot."),
        "steps": _notes(profiler.notes.get("steps", []))
        + _step_stats(data)
        + _charts_or_empty(profiler.step_charts, "No step timings to plot."),
    }
    nav = "".join(f'<a href="#{key}">{escape(title)}</a>' for key, title in SECTIONS)
    sections = "".join(
        f'<section id="{key}"><h2>{escape(title)}</h2>{bodies[key]}</section>' for key, title in SECTIONS
    )
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data.generated_at))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>trainguard report: {escape(data.name)}</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<header><h1>trainguard report: {escape(data.name)}</h1>"
        f"<p><code>{escape(data.path)}</code> · generated {generated} · read in {data.read_seconds:.2f} s</p></header>"
        f"<nav>{nav}</nav><main>{sections}</main></body></html>\n"
    )
