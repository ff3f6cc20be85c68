"""The statuses a job and a rule go through, spelled once for the rules, the CLI, the client
(``trainguard submit``) and the service: SageMaker's ``TrainingJobStatus`` and
``RuleEvaluationStatus`` values, unchanged on its API. Standard library only, so the client can
import it without the rule framework."""

from __future__ import annotations

import enum

__all__ = ["JOB_STATUSES", "JOB_TERMINAL", "JobStatus", "RULE_STATUSES", "RULE_TERMINAL", "RuleStatus"]


class RuleStatus(str, enum.Enum):
    """SageMaker's ``RuleEvaluationStatus`` values."""

    IN_PROGRESS = "InProgress"
    ISSUES_FOUND = "IssuesFound"
    NO_ISSUES_FOUND = "NoIssuesFound"
    ERROR = "Error"
    STOPPING = "Stopping"
    STOPPED = "Stopped"


class JobStatus(str, enum.Enum):
    """SageMaker's ``TrainingJobStatus`` values."""

    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"


# Plain strings (what JSON, SQL and pydantic's Literal hold), in the enums' order.
RULE_STATUSES: tuple[str, ...] = tuple(status.value for status in RuleStatus)
JOB_STATUSES: tuple[str, ...] = tuple(status.value for status in JobStatus)
# A rule or a job in one of these will not change again by itself.
RULE_TERMINAL: tuple[str, ...] = (
    RuleStatus.ISSUES_FOUND.value,
    RuleStatus.NO_ISSUES_FOUND.value,
    RuleStatus.ERROR.value,
    RuleStatus.STOPPED.value,
)
JOB_TERMINAL: tuple[str, ...] = (JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.STOPPED.value)
