"""The native job spec (request body of ``POST /v1/jobs``) and its validation.

Validation happens here, before anything starts, so that a bad spec is a 422 naming the field:
unknown rules list the valid ones, rule parameters are checked by the rule class itself, the hook
config by the same parser the training process uses, action names against the known handlers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["AlarmConfig", "JobSpec", "Resources", "RuleConfig", "StoppingCondition", "RUNNER_PARAMETERS"]

JOB_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
# Parameters the runner consumes itself (every rule accepts them), not the rule class.
RUNNER_PARAMETERS = frozenset({"start_step", "end_step"})
COMPARISONS = (
    "GreaterThanOrEqualToThreshold",
    "GreaterThanThreshold",
    "LessThanThreshold",
    "LessThanOrEqualToThreshold",
)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(None, gt=0, description="CPU limit in cores (fractions allowed)")
    memory_mb: int | None = Field(None, gt=0, description="memory limit in MiB")


class StoppingCondition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_runtime_seconds: int | None = Field(None, gt=0, description="stop the job after this many seconds")


def _validate_actions(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from trainguard.services.actions import action_names

    known = action_names()
    for index, action in enumerate(actions):
        name = str(action.get("name", "")).lower()
        if name not in known:
            raise ValueError(f"action {index}: unknown name {action.get('name')!r}; valid: {', '.join(sorted(known))}")
        if name == "webhook" and not action.get("url"):
            raise ValueError(f"action {index}: webhook needs 'url'")
        if name in ("email", "sms") and not action.get("endpoint"):
            raise ValueError(f"action {index}: {name} needs 'endpoint' (an address or phone number)")
        if name == "sns" and not action.get("topic_arn"):
            raise ValueError(f"action {index}: sns needs 'topic_arn'")
    return actions


class _Unopened:
    """An other-trial path during validation (rules open only string paths)."""

    def __init__(self, path: str) -> None:
        self.path = path.strip()


class RuleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule: str = Field(description="built-in rule name, entry-point name or 'package.module:Class'")
    name: str | None = Field(None, max_length=256, description="RuleConfigurationName (default: the rule name)")
    parameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    actions: list[dict[str, Any]] = Field(default_factory=list, description="e.g. [{'name': 'stoptraining'}]")
    kind: Literal["debug", "profiler"] = "debug"
    source_uri: str | None = Field(None, description="a .py file (s3:// or path) that defines the custom rule class")

    @property
    def configuration_name(self) -> str:
        return self.name or self.rule.rpartition(":")[2]

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("empty rule name")
        return value

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _validate_actions(value)

    @model_validator(mode="after")
    def _rule_and_parameters(self) -> RuleConfig:
        if self.source_uri:
            return self  # the class lives in a file the runner fetches; checked when it starts
        from trainguard.errors import ConfigError
        from trainguard.rules import Rule, get_rule_class

        try:
            rule_class = get_rule_class(self.rule)
        except ConfigError as error:
            raise ValueError(f"rule: {error}") from None
        skipped = RUNNER_PARAMETERS | {"other_trials", "action_json"}
        parameters = {k: v for k, v in self.parameters.items() if k not in skipped}
        # A rule opens its other trials when built (a wait per run): validate with unopened
        # stand-ins; the paths are opened by the rule runner.
        others = [_Unopened(p) for p in str(self.parameters.get("other_trials") or "").split(",") if p.strip()]
        if isinstance(rule_class, type) and issubclass(rule_class, Rule):
            try:
                strings = {k: str(v) if not isinstance(v, str) else v for k, v in parameters.items()}
                rule_class(None, other_trials=others, **strings)
            except ConfigError as error:
                raise ValueError(f"parameters: {error}") from None
            except Exception:  # noqa: BLE001 - a rule that needs a trial to construct is checked at run time
                pass
        return self


class AlarmConfig(BaseModel):
    """A CloudWatch-style alarm on a rule metric, evaluated by trainguard itself."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256)
    metric_name: Literal["RuleIssuesFound"] = "RuleIssuesFound"
    rule: str | None = Field(None, description="RuleConfigurationName the alarm watches (default: every rule)")
    threshold: float = 1.0
    comparison: Literal[COMPARISONS] = "GreaterThanOrEqualToThreshold"  # type: ignore[valid-type]
    evaluation_periods: int = Field(1, ge=1, le=100, description="M: how many latest datapoints are evaluated")
    datapoints_to_alarm: int | None = Field(None, ge=1, description="N of M breaching datapoints (default M)")
    actions: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _validate_actions(value)

    @model_validator(mode="after")
    def _n_of_m(self) -> AlarmConfig:
        if self.datapoints_to_alarm is not None and self.datapoints_to_alarm > self.evaluation_periods:
            raise ValueError(
                f"datapoints_to_alarm={self.datapoints_to_alarm} exceeds evaluation_periods={self.evaluation_periods}"
            )
        return self


class JobSpec(BaseModel):
    """A training job: what to run, how to capture, which rules watch it and what they may do."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=JOB_NAME_PATTERN, description="1-63 characters: letters, digits, hyphens")
    image: str | None = Field(None, description="training image (docker launcher; ignored by the local one)")
    command: list[str] = Field(default_factory=list, description="the training command, e.g. ['python', 'train.py']")
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = Field(None, description="working directory of the training command")
    resources: Resources = Field(default_factory=Resources)
    hook_config: dict[str, Any] | None = Field(None, description="SageMaker DebugHookConfig object")
    rules: list[RuleConfig] = Field(default_factory=list)
    profiler_config: dict[str, Any] | None = Field(None, description="SageMaker ProfilerConfig object")
    stopping_condition: StoppingCondition = Field(default_factory=StoppingCondition)
    alarms: list[AlarmConfig] = Field(default_factory=list)

    @field_validator("hook_config")
    @classmethod
    def _valid_hook_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        from trainguard.errors import ConfigError
        from trainguard.hooks.json_config import hook_kwargs_from_document

        try:
            hook_kwargs_from_document({k: v for k, v in value.items() if k != "S3OutputPath"})
        except ConfigError as error:
            raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> JobSpec:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.configuration_name in seen:
                raise ValueError(f"rules: two rule configurations are named {rule.configuration_name!r}")
            seen.add(rule.configuration_name)
        alarm_names: set[str] = set()
        for alarm in self.alarms:
            if alarm.rule is not None and alarm.rule not in seen:
                raise ValueError(
                    f"alarms: alarm {alarm.name!r} watches rule {alarm.rule!r}, which is not among the job's rules"
                    f" ({', '.join(sorted(seen)) or 'none'})"
                )
            if alarm.name in alarm_names:
                raise ValueError(f"alarms: two alarms are named {alarm.name!r}")
            alarm_names.add(alarm.name)
        return self
