"""Which findings a job's stop actions are evaluated for: every one, as ``trainguard run`` does.

An alarm runs its actions when it *enters* ALARM (CloudWatch's semantics, kept for notifications:
one e-mail per alarm, not one per finding). A stop decided only then was decided on the first
breaching finding alone: a rule whose first findings are uncertain (reported, never stopping)
and whose later finding is certain kept the alarm in ALARM, so the certain finding never reached
the stop and the job trained to its end. ``trainguard run --stop-on-issue`` looks at every
finding (rules/autostop.py), and so does the service: while the alarm stays in ALARM, each new
breaching finding is put to the alarm's stop actions again, until one was recorded for a
certain finding (more would only repeat the same stop).

What stops is the same everywhere (:func:`finding_stops`): a finding that is certain
(``StepResult.certain``) and not advice (a property of the data or the initialisation:
advice never stops, see trainguard.rules.advice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainguard.services.actions.dispatch import STOP_ACTIONS

__all__ = ["finding_at", "finding_stops", "is_stop_action", "restop_actions"]


def is_stop_action(action: Mapping[str, Any]) -> bool:
    return str(action.get("name") or "").lower() in STOP_ACTIONS


def finding_stops(finding: Mapping[str, Any] | None) -> tuple[bool, str]:
    """(whether ``finding`` may stop a job, why not when it may not).

    A finding without a ``certain`` key (a custom rule written before it existed, an alarm on a
    metric of the user's own) stops, as before: only a finding that says it is uncertain, or
    advice, declines.
    """
    if not finding:
        return True, ""
    where = f"the finding at step {finding.get('step')}"
    if finding.get("advice"):
        return False, f"{where} is advice (a property of the data or the initialisation): advice never stops"
    if finding.get("certain") is False:
        return False, f"{where} is not certain"
    return True, ""


def finding_at(findings: Sequence[Mapping[str, Any]] | None, step: Any) -> Mapping[str, Any] | None:
    """The finding of ``findings`` (oldest first) at ``step``, else the latest; None without any."""
    if not findings:
        return None
    if step is not None:
        for finding in reversed(findings):
            if finding.get("step") == step:
                return finding
    return findings[-1]


def restop_actions(
    actions: Iterable[Mapping[str, Any]],
    finding: Mapping[str, Any] | None,
    earlier_stop_findings: Iterable[Mapping[str, Any] | None],
) -> list[dict[str, Any]]:
    """The stop actions to record for a new breaching ``finding`` of an alarm that stayed in ALARM.

    None when the finding may not stop (the handler would only decline it again: recording that
    for every uncertain finding of a rule that fires at each step would flood the job's action
    list), or when a stop was already recorded for a finding that may stop.
    """
    stops, _ = finding_stops(finding)
    if finding is None or not stops:
        return []
    if any(finding_stops(earlier)[0] for earlier in earlier_stop_findings):
        return []
    return [dict(action) for action in actions if is_stop_action(action)]
