"""A run's rule results as the dashboard shows them: the diagnosis, advice apart, a rules table
with why a rule could not evaluate, and the steps to mark on the charts.

The ranking is :func:`trainguard.rules.diagnosis.diagnose`'s (the same as ``trainguard run``'s
summary and the report); this module only arranges it. Advice (``"advice": true``: a property of
the data or the initialisation) is listed on its own and never counted as an issue, unless the
diagnosis itself made it a finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import StorageError, TrainguardError
from trainguard.storage.base import Store

__all__ = ["RULE_OUTPUT_PREFIX", "RuleState", "arrange"]

RULE_OUTPUT_PREFIX = "rule-output/"
_NOT_EVALUATED = "RuleNotEvaluated:"
_SECTIONS = ("primary", "consequences", "other")


def _fired(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in result.get("findings") or () if isinstance(f, dict) and f.get("fired", True)]


def _is_advice(finding: dict[str, Any]) -> bool:
    return bool(finding.get("advice"))


def _not_evaluated_reason(result: dict[str, Any]) -> str:
    details = str(result.get("status_details") or "").strip()
    if result.get("status") != "Error":
        return ""
    return details[len(_NOT_EVALUATED) :].strip() if details.startswith(_NOT_EVALUATED) else details


def arrange(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Diagnosis, advice, rules table, counts and chart events of a run's rule results."""
    from trainguard.rules.diagnosis import diagnose

    diagnosis = diagnose(results)
    ranked = {(item.get("rule"), item.get("step")) for section in _SECTIONS for item in diagnosis.get(section) or ()}
    if "advice" in diagnosis:  # the diagnosis lists advice itself (and promotes it to possible causes)
        advice = list(diagnosis["advice"])
    else:
        advice = [
            {**{key: finding.get(key) for key in ("step", "worker", "message", "fix_hint")}, "rule": result.get("rule")}
            for result in results
            for finding in _fired(result)
            if _is_advice(finding) and (result.get("rule"), finding.get("step")) not in ranked
        ]
    table = []
    counts = {"rules": len(results), "issues": 0, "advice": len(advice), "not_evaluated": 0, "not_applicable": 0}
    for result in sorted(results, key=lambda r: str(r.get("configuration_name") or r.get("rule"))):
        fired = _fired(result)
        issues = [f for f in fired if not _is_advice(f)]
        reason = _not_evaluated_reason(result)
        if result.get("status") == "IssuesFound":
            counts["issues"] += 1
        # A rule the run's design rules out (no tanh, another framework) is counted apart, as the
        # summary does: "not evaluated" is left for what should have been there.
        not_applicable = bool(reason) and bool(result.get("not_applicable"))
        if reason:
            counts["not_applicable" if not_applicable else "not_evaluated"] += 1
        table.append(
            {
                "configuration_name": result.get("configuration_name") or result.get("rule"),
                "rule": result.get("rule"),
                "status": result.get("status"),
                "status_details": result.get("status_details") or "",
                "not_evaluated": reason,
                "not_applicable": not_applicable,
                "missing": [
                    str(item.get("what") or item.get("collection") or item) if isinstance(item, dict) else str(item)
                    for item in result.get("missing") or ()
                ],
                "last_evaluated_step": result.get("last_evaluated_step"),
                "findings": len(issues),
                "advice": len(fired) - len(issues),
                "first_step": min((int(f.get("step", 0)) for f in issues), default=None),
                # findings the runner left out of its file to bound its size
                "dropped": int(result.get("dropped_findings") or 0),
            }
        )
    events = []
    for section in _SECTIONS:
        for item in diagnosis.get(section) or ():
            if isinstance(item.get("step"), int):
                events.append(
                    {"step": item["step"], "label": f"{item.get('rule')} (step {item['step']})", "kind": "finding"}
                )
    primary = next(iter(diagnosis.get("primary") or ()), None)
    return {
        "diagnosis": diagnosis,
        "advice": advice,
        "rules": table,
        "counts": counts,
        "events": events,
        "primary_line": _one_line(primary) if primary else "",
    }


def _one_line(finding: dict[str, Any]) -> str:
    where = f"step {finding.get('step')}"
    workers = finding.get("workers") or ([finding["worker"]] if finding.get("worker") else [])
    if workers:
        where += f" ({', '.join(workers)})"
    return f"{finding.get('rule')} at {where}: {finding.get('message')}"


@dataclass
class RuleState:
    """The rule-output files of one run, re-read when their listing or sizes change."""

    results: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    arranged: dict[str, Any] = field(default_factory=lambda: arrange([]))
    _raw: dict[str, bytes] = field(default_factory=dict)

    def set_results(self, results: list[dict[str, Any]]) -> None:
        """Results from elsewhere (the service's database, which rule runners report to)."""
        if results != self.results:
            self.results, self.problems = list(results), []
            self.arranged = arrange(self.results)

    def refresh(self, store: Store) -> None:
        try:
            keys = [
                key
                for key in store.list(RULE_OUTPUT_PREFIX)
                if key.endswith(".json") and "/" not in key[len(RULE_OUTPUT_PREFIX) :]
            ]
        except (StorageError, TrainguardError) as error:
            self.problems = [f"cannot list {RULE_OUTPUT_PREFIX}: {error}"]
            return
        changed = set(keys) != set(self._raw)
        raw = {}
        for key in keys:
            try:
                raw[key] = store.read(key)
            except (StorageError, TrainguardError):
                raw[key] = self._raw.get(key, b"")
            changed = changed or raw[key] != self._raw.get(key)
        if not changed:
            return
        self._raw = raw
        results, problems = [], []
        for key, data in sorted(raw.items()):
            try:
                parsed = json.loads(data)
            except ValueError as error:
                problems.append(f"{key} is not a rule result file: {error}")
                continue
            if isinstance(parsed, dict):
                parsed.setdefault("configuration_name", key[len(RULE_OUTPUT_PREFIX) : -len(".json")])
                parsed.setdefault("rule", parsed["configuration_name"])
                results.append(parsed)
        self.results, self.problems = results, problems
        self.arranged = arrange(results)
