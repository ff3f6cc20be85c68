"""Only certain findings stop training: the service's stoptraining action handler."""

from __future__ import annotations

from trainguard.services.actions import ActionContext, build_event, get_handler


def _event(finding: dict | None) -> dict:
    description = {"TrainingJobName": "job-1", "TrainingJobStatus": "InProgress",
                   "DebugRuleEvaluationStatuses": [{"RuleConfigurationName": "R", "RuleEvaluationStatus": "IssuesFound"}]}  # fmt: skip
    extra = {"rule": "R", **({"finding": finding} if finding is not None else {})}
    return build_event(description, account="000000000000", region="us-east-1", extra=extra)


def test_stoptraining_acts_on_certain_findings_only() -> None:
    stopped: list[str] = []
    context = ActionContext("job-1", stop_job=lambda name, grace, cause: stopped.append(name),
                            in_progress_jobs=lambda: ["job-1"])  # fmt: skip
    action = {"name": "stoptraining"}
    detail = get_handler("stoptraining")(_event({"step": 40, "certain": False, "message": "noise?"}), action, context)
    assert detail.startswith("not stopped") and "not certain" in detail and stopped == []
    get_handler("stoptraining")(_event({"step": 50, "certain": True, "message": "loss is NaN"}), action, context)
    assert stopped == ["job-1"]
    # an alarm on a metric of the user's own (no rule finding) stops as it always did
    get_handler("stoptraining")(_event(None), action, context)
    assert stopped == ["job-1", "job-1"]
