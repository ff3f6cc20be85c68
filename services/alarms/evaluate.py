"""Alarm evaluation: threshold, comparison, N of M datapoints."""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AlarmSpec", "AlarmState", "breaches", "evaluate_alarm", "implicit_rule_alarm"]

_COMPARE = {
    "GreaterThanOrEqualToThreshold": operator.ge,
    "GreaterThanThreshold": operator.gt,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}


class AlarmState(str, enum.Enum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


@dataclass(frozen=True)
class AlarmSpec:
    name: str
    metric_name: str = "RuleIssuesFound"
    rule: str | None = None  # RuleConfigurationName; None = any rule of the job
    threshold: float = 1.0
    comparison: str = "GreaterThanOrEqualToThreshold"
    evaluation_periods: int = 1
    datapoints_to_alarm: int | None = None
    actions: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.comparison not in _COMPARE:
            raise ValueError(f"alarm {self.name}: comparison {self.comparison!r}; valid: {', '.join(_COMPARE)}")
        if self.evaluation_periods < 1:
            raise ValueError(f"alarm {self.name}: evaluation_periods must be at least 1")
        if self.datapoints_to_alarm is not None and not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ValueError(f"alarm {self.name}: datapoints_to_alarm must be between 1 and evaluation_periods")

    @property
    def required(self) -> int:
        return self.datapoints_to_alarm or self.evaluation_periods

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["actions"] = [dict(action) for action in self.actions]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlarmSpec:
        values = dict(data)
        values["actions"] = tuple(values.get("actions") or ())
        return cls(**values)


def breaches(spec: AlarmSpec, value: float) -> bool:
    return bool(_COMPARE[spec.comparison](value, spec.threshold))


def evaluate_alarm(spec: AlarmSpec, values: Sequence[float]) -> tuple[AlarmState, str]:
    """The alarm's state from the metric's datapoints in time order (oldest first)."""
    window = list(values)[-spec.evaluation_periods :]
    breaching = sum(1 for value in window if breaches(spec, value))
    description = (
        f"{breaching} of the latest {len(window)} datapoint(s) of {spec.metric_name} "
        f"{'for ' + spec.rule if spec.rule else ''} breach {spec.comparison} {spec.threshold:g}"
    ).replace("  ", " ")
    if breaching >= spec.required:
        return (
            AlarmState.ALARM,
            f"Threshold Crossed: {description} (needs {spec.required} of {spec.evaluation_periods})",
        )
    if len(window) < spec.evaluation_periods and breaching + (spec.evaluation_periods - len(window)) >= spec.required:
        return AlarmState.INSUFFICIENT_DATA, f"Insufficient data: {description}"
    return AlarmState.OK, description


def implicit_rule_alarm(configuration_name: str, actions: Sequence[Mapping[str, Any]]) -> AlarmSpec:
    """SageMaker's rule actions as an alarm: fire on the first IssuesFound datapoint of the rule.

    Advice (``StepResult.advice``: a property of the data or the initialisation) is reported as a
    RuleIssuesFound datapoint of 0 by the rule runner and the API, so it never sets this off."""
    return AlarmSpec(
        name=f"{configuration_name}-IssuesFound",
        metric_name="RuleIssuesFound",
        rule=configuration_name,
        threshold=1.0,
        comparison="GreaterThanOrEqualToThreshold",
        evaluation_periods=1,
        actions=tuple(actions),
    )
