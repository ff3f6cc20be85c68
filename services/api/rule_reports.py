"""What rule runners report (``POST /v1/internal/jobs/{name}/rules/{configuration}/status``): one
``StatusUpdate.to_dict()`` with its step result and batched datapoints, validated before the job
service applies it, so a bad report is a 422 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from trainguard.services.api.safe_fields import MAX_STEP, SafeText, safe_tree

from trainguard.statuses import RULE_STATUSES

__all__ = ["DatapointReport", "MissingTensorReport", "RuleStatusReport", "StepResultReport"]

_Step = Annotated[int, Field(ge=-1, le=MAX_STEP)]


class _Open(BaseModel):
    """Known members are type-checked; members a newer runner adds are kept (forward compatible)."""

    model_config = ConfigDict(extra="allow", strict=True)


class MissingTensorReport(_Open):
    what: Annotated[str, SafeText(4096)]
    collection: Annotated[str, SafeText(1024)] | None = None


class StepResultReport(_Open):
    rule: Annotated[str, SafeText(512)] = ""
    step: _Step
    fired: bool = False
    message: Annotated[str, SafeText(65536)] = ""
    fix_hint: Annotated[str, SafeText(65536)] | None = ""
    details: dict[str, Any] = Field(default_factory=dict)
    missing: list[MissingTensorReport] = Field(default_factory=list, max_length=1000)
    certain: bool = False
    worker: Annotated[str, SafeText(256)] | None = None
    not_evaluated: Annotated[str, SafeText(65536)] | None = None
    advice: bool = False  # a property of the data or the initialisation: no issue, no alarm

    @field_validator("details")
    @classmethod
    def _safe_details(cls, value: dict[str, Any]) -> dict[str, Any]:
        return safe_tree(value, "details", finite=False)


class DatapointReport(_Open):
    metric: Annotated[str, SafeText(128, 1)] = "RuleIssuesFound"
    value: float = Field(allow_inf_nan=False, ge=-1e15, le=1e15)
    step: _Step | None = None


class RuleStatusReport(_Open):
    """One ``StatusUpdate.to_dict()`` (plus batched datapoints) from a rule runner."""

    configuration_name: Annotated[str, SafeText(256)] | None = None
    rule: Annotated[str, SafeText(512)] | None = None
    status: Literal[RULE_STATUSES] | None = Field(  # type: ignore[valid-type]
        None, description="a RuleEvaluationStatus; absent: datapoints only. A final status is never replaced."
    )
    status_details: Annotated[str, SafeText(65536)] | None = ""
    step: _Step | None = None
    result: StepResultReport | None = None
    last_evaluated_step: _Step | None = None
    timestamp: float | None = Field(None, allow_inf_nan=False, ge=0, le=253402300799)
    datapoints: list[DatapointReport] | None = Field(None, max_length=10000)
    outbox: Annotated[str, SafeText(64, 1)] | None = Field(
        None, description="the runner's outbox id (with sequence: applied once)"
    )
    sequence: int | None = Field(None, ge=0, le=MAX_STEP, description="the report's number in its outbox")

    @field_validator("status", mode="before")
    @classmethod
    def _empty_status(cls, value: Any) -> Any:
        return None if value == "" else value
