"""Figures and tables from scored cases: per-rule precision/recall, healthy runs flagged, right
primary diagnosis, findings per faulty run, first detection relative to the fault's onset."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.detection.score import CaseResult, Verdict


@dataclass
class Summary:
    split: str
    rule_set: str
    healthy: int = 0
    faulty: int = 0
    healthy_flagged: list[tuple[str, str]] = field(default_factory=list)  # (case, "Rule@step: message")
    healthy_advice: list[tuple[str, str]] = field(default_factory=list)  # advice on healthy runs: no alarm
    right_primary: list[str] = field(default_factory=list)
    # no primary finding, but an expected rule advised: a data property on a run that shows no
    # learning symptom, which the advice contract reports as advice and never as the primary
    right_by_advice: list[str] = field(default_factory=list)
    wrong_primary: list[tuple[str, str]] = field(default_factory=list)  # (case, what was primary or "nothing")
    findings_per_faulty: list[int] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # first expected finding - onset, in save intervals
    per_rule: dict[str, dict[str, int]] = field(default_factory=dict)
    not_evaluated: dict[str, int] = field(default_factory=dict)
    unverified: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    diagnosis_from_cli: int = 0

    @property
    def right_primary_rate(self) -> float:
        return len(self.right_primary) / self.faulty if self.faulty else 0.0

    @property
    def right_rate(self) -> float:
        """Right primary, or (no primary) the expected advice."""
        return (len(self.right_primary) + len(self.right_by_advice)) / self.faulty if self.faulty else 0.0

    @property
    def median_findings(self) -> float:
        return statistics.median(self.findings_per_faulty) if self.findings_per_faulty else 0.0

    @property
    def median_delay(self) -> float | None:
        return statistics.median(self.delays) if self.delays else None


def _primary_rule(verdict: Verdict) -> str | None:
    return verdict.primary[0].get("rule") if verdict.primary else None


def summarise(results: list[CaseResult], split: str, rule_set: str) -> Summary:
    summary = Summary(split, rule_set)
    for result in results:
        if split != "all" and result.split != split:
            continue
        if result.error or rule_set not in result.verdicts:
            summary.errors.append((result.name, result.error or "no verdict"))
            continue
        verdict = result.verdicts[rule_set]
        if verdict.error:
            summary.errors.append((result.name, verdict.error))
            if result.label == "healthy":  # no rule judged it: its silence is no evidence (a faulty one is a miss)
                continue
        if not result.symptom_ok:
            summary.unverified.append((result.name, result.symptom_seen))
        summary.diagnosis_from_cli += verdict.diagnosis_from_cli
        for rule in verdict.not_evaluated:
            summary.not_evaluated[rule] = summary.not_evaluated.get(rule, 0) + 1
        for rule in set(verdict.statuses) | set(verdict.findings) | set(verdict.advice):
            counts = summary.per_rule.setdefault(
                rule, {"tp": 0, "fp_healthy": 0, "off_label": 0, "positives": 0, "advice_healthy": 0, "advice_faulty": 0}
            )
            fired = rule in verdict.findings
            counts["advice_healthy" if result.label == "healthy" else "advice_faulty"] += rule in verdict.advice
            if result.label == "healthy":
                counts["fp_healthy"] += fired
            else:
                counts["positives"] += rule in result.expected
                if fired:
                    counts["tp" if rule in result.expected else "off_label"] += 1
        if result.label == "healthy":
            summary.healthy += 1
            for finding in sorted(verdict.findings.values(), key=lambda f: f.step):
                summary.healthy_flagged.append((result.name, f"{finding.rule}@{finding.step}: {finding.message}"))
            for finding in sorted(verdict.advice.values(), key=lambda f: f.step):
                summary.healthy_advice.append((result.name, f"{finding.rule}@{finding.step}: {finding.message}"))
            continue
        summary.faulty += 1
        primary = _primary_rule(verdict)
        advised = [rule for rule in result.expected if rule in verdict.advice]
        if primary is not None and primary in result.expected:
            summary.right_primary.append(result.name)
        elif primary is None and advised:
            summary.right_by_advice.append(result.name)
        else:
            shown = primary or "nothing"
            if primary is not None:
                shown += f"@{verdict.primary[0].get('step')}: {verdict.primary[0].get('message')}"
            elif verdict.advice:
                shown += " (advice: " + ", ".join(sorted(verdict.advice)) + ")"
            summary.wrong_primary.append((result.name, shown))
        summary.findings_per_faulty.append(len(verdict.primary) + len(verdict.consequences))
        steps = [verdict.findings[rule].step for rule in result.expected if rule in verdict.findings]
        if not steps and primary is None:
            steps = [verdict.advice[rule].step for rule in advised]
        if steps:
            summary.delays.append((min(steps) - result.onset) / result.save_interval)
    return summary


def _pct(part: int | float, whole: int | float) -> str:
    return f"{100.0 * part / whole:.0f} %" if whole else "–"


def render(summary: Summary) -> str:
    """The tables of one (split, rule set), in Markdown (readable as text too)."""
    lines: list[str] = []
    flagged_runs = sorted({name for name, _ in summary.healthy_flagged})
    delay = summary.median_delay
    lines.append(f"### Split: {summary.split}, rules: {summary.rule_set}")
    lines.append("")
    lines.append("| Measure | Value | Target |")
    lines.append("|---|---|---|")
    lines.append(f"| Healthy runs | {summary.healthy} | |")
    lines.append(f"| Faulty runs | {summary.faulty} | |")
    advised_runs = sorted({name for name, _ in summary.healthy_advice})
    right = len(summary.right_primary) + len(summary.right_by_advice)
    lines.append(f"| Healthy runs with a finding | {len(flagged_runs)} ({_pct(len(flagged_runs), summary.healthy)}) | 0 |")
    lines.append(f"| Healthy runs with advice only (no alarm; counted apart) | "
                 f"{len([n for n in advised_runs if n not in flagged_runs])} | |")  # fmt: skip
    lines.append(
        f"| Faulty runs with an expected rule as primary finding, or (no primary) as advice | {right} "
        f"({_pct(right, summary.faulty)}) | ≥ 95 % |"
    )
    lines.append(
        f"| … of which as primary finding | {len(summary.right_primary)} "
        f"({_pct(len(summary.right_primary), summary.faulty)}) | |"
    )
    lines.append(f"| Findings (primary + consequences) per faulty run, median | {summary.median_findings:g} | ≤ 2 |")
    lines.append(
        f"| First expected finding − onset, save intervals, median | "
        f"{'–' if delay is None else f'{delay:g}'} (over {len(summary.delays)} detected) | ≤ 2 |"
    )
    diagnosis = (
        "the CLI's `diagnosis` line"
        if summary.diagnosis_from_cli and summary.diagnosis_from_cli == summary.healthy + summary.faulty
        else f"computed by the scorer (earliest finding primary, all others consequences) for "
        f"{summary.healthy + summary.faulty - summary.diagnosis_from_cli} runs without a `diagnosis` line"
    )
    lines.append(f"| Diagnosis taken from | {diagnosis} | |")
    lines.append("")
    lines.append("| Rule | Fired on faulty (expected) | Fired on faulty (not expected) | Fired on healthy | "
                 "Precision | Recall | Advice on healthy / faulty | Not evaluated (runs) |")  # fmt: skip
    lines.append("|---|---|---|---|---|---|---|---|")
    for rule in sorted(summary.per_rule):
        c = summary.per_rule[rule]
        fired = c["tp"] + c["off_label"] + c["fp_healthy"]
        lines.append(
            f"| {rule} | {c['tp']} | {c['off_label']} | {c['fp_healthy']} | {_pct(c['tp'], fired)} | "
            f"{_pct(c['tp'], c['positives'])} ({c['positives']}) | {c.get('advice_healthy', 0)} / "
            f"{c.get('advice_faulty', 0)} | {summary.not_evaluated.get(rule, 0)} |"
        )
    lines.append("")
    lines.append("Precision: findings on faulty runs whose label expects the rule / all its findings. "
                 "Recall: faulty runs expecting the rule on which it fired (number expecting it).")  # fmt: skip
    lines.append("")
    if summary.healthy_flagged:
        lines.append("Healthy runs with a finding:")
        lines.append("")
        for name, text in summary.healthy_flagged:
            lines.append(f"- {name}: {_clip(text)}")
        lines.append("")
    if summary.healthy_advice:
        lines.append("Advice on healthy runs (no alarm, not a finding):")
        lines.append("")
        for name, text in summary.healthy_advice:
            lines.append(f"- {name}: {_clip(text)}")
        lines.append("")
    if summary.right_by_advice:
        lines.append("Faulty runs with no primary finding whose expected rule advised: " + ", ".join(summary.right_by_advice))
        lines.append("")
    if summary.wrong_primary:
        lines.append("Faulty runs without an expected rule as primary finding (primary shown):")
        lines.append("")
        for name, primary in summary.wrong_primary:
            lines.append(f"- {name}: {primary}")
        lines.append("")
    if summary.unverified:
        lines.append("Runs whose label's symptom did not show (label not confirmed by the run's own metrics):")
        lines.append("")
        for name, seen in summary.unverified:
            lines.append(f"- {name}: {seen}")
        lines.append("")
    if summary.errors:
        lines.append("Errors:")
        lines.append("")
        for name, text in summary.errors:
            lines.append(f"- {name}: {_clip(text)}")
        lines.append("")
    return "\n".join(lines)


def _clip(text: str, limit: int = 220) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def case_table(results: list[CaseResult], rule_set: str) -> str:
    """One row per case: label, split, expected, primary, other findings (Markdown)."""
    lines = ["| Case | Split | Label: expected | Primary finding | Consequences / other | Symptom |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for result in results:
        verdict = result.verdicts.get(rule_set)
        if verdict is None:
            lines.append(f"| {result.name} | {result.split} | {result.label} | error | {_clip(result.error, 80)} | |")
            continue
        primary = ", ".join(f"{p.get('rule')}@{p.get('step')}" for p in verdict.primary) or "–"
        others = ", ".join(f"{p.get('rule')}@{p.get('step')}" for p in verdict.consequences + verdict.other) or "–"
        if verdict.advice:
            others += "; advice: " + ", ".join(f"{f.rule}@{f.step}" for f in verdict.advice.values())
        label = result.label if result.label == "healthy" else "faulty: " + "/".join(result.expected)
        if result.label != "healthy" and result.onset:
            label += f" (onset {result.onset})"
        lines.append(
            f"| {result.name} | {result.split} | {label} | {primary} | {others} | "
            f"{'ok' if result.symptom_ok else 'NOT SEEN'}: {result.symptom_seen} |"
        )
    return "\n".join(lines)


def as_json(summary: Summary) -> dict[str, Any]:
    return {
        "split": summary.split,
        "rule_set": summary.rule_set,
        "healthy": summary.healthy,
        "faulty": summary.faulty,
        "healthy_flagged_runs": sorted({name for name, _ in summary.healthy_flagged}),
        "healthy_advice_runs": sorted({name for name, _ in summary.healthy_advice}),
        "right_primary": len(summary.right_primary),
        "right_primary_rate": summary.right_primary_rate,
        "right_by_advice": summary.right_by_advice,
        "right_rate": summary.right_rate,
        "wrong_primary": summary.wrong_primary,
        "healthy_flagged": summary.healthy_flagged,
        "median_findings": summary.median_findings,
        "median_delay_intervals": summary.median_delay,
        "per_rule": summary.per_rule,
        "unverified": summary.unverified,
        "errors": summary.errors,
    }
