"""Job and rule statuses are spelled once (trainguard.statuses) and are SageMaker's values: the
rules, ``trainguard submit``, the service's job state and its request schema use the same ones."""

from __future__ import annotations

import pytest

from trainguard.statuses import JOB_STATUSES, JOB_TERMINAL, RULE_STATUSES, RULE_TERMINAL, JobStatus, RuleStatus


def test_the_values_are_sagemakers() -> None:
    # RuleEvaluationStatus and TrainingJobStatus as the SageMaker API spells them (never renamed)
    assert RULE_STATUSES == ("InProgress", "IssuesFound", "NoIssuesFound", "Error", "Stopping", "Stopped")
    assert JOB_STATUSES == ("InProgress", "Completed", "Failed", "Stopping", "Stopped")
    assert set(RULE_TERMINAL) == set(RULE_STATUSES) - {"InProgress", "Stopping"}
    assert set(JOB_TERMINAL) == set(JOB_STATUSES) - {"InProgress", "Stopping"}
    assert all(type(status) is str for status in (*RULE_STATUSES, *JOB_STATUSES, *RULE_TERMINAL, *JOB_TERMINAL))
    assert RuleStatus.ISSUES_FOUND == "IssuesFound" and JobStatus.COMPLETED == "Completed"


def test_the_rules_use_the_shared_enum() -> None:
    from trainguard.rules import RuleStatus as from_rules
    from trainguard.rules.base import RuleStatus as from_base

    assert from_rules is RuleStatus and from_base is RuleStatus


def test_the_service_schema_takes_exactly_these() -> None:
    pytest.importorskip("pydantic")
    from pydantic import ValidationError

    from trainguard.services.api import rule_reports

    assert rule_reports.RULE_STATUSES is RULE_STATUSES
    for status in RULE_STATUSES:
        assert rule_reports.RuleStatusReport(status=status).status == status
    with pytest.raises(ValidationError):
        rule_reports.RuleStatusReport(status="Completed")  # a job status, not a rule's
