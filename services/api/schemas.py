"""The native job spec (request body of ``POST /v1/jobs``) and its validation.

Validation happens here, before anything starts, so that a bad spec is a 422 naming the field:
unknown rules list the valid ones, rule parameters are checked by the rule class itself, the hook
config by the same parser the training process uses, action names against the known handlers.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from trainguard.services.api.safe_fields import MAX_STEP, SafeText, safe_tree
from trainguard.services.api.sagemaker_validation import (
    DEBUG_HOOK_LOCATIONS,
    MAX_RULE_CONFIGURATION_NAME,
    MAX_RUNTIME_SECONDS,
    PROFILER_CONFIG,
    member_errors,
    structure,
)
from trainguard.services.api.spec_limits import (
    MIN_CPUS,
    MIN_MEMORY_MB,
    check_command,
    check_document_size,
    check_environment,
    nesting_problem,
)

__all__ = ["AlarmConfig", "JobSpec", "Resources", "RuleConfig", "StoppingCondition", "RUNNER_PARAMETERS"]

JOB_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
# Parameters the runner consumes itself (every rule accepts them), not the rule class.
RUNNER_PARAMETERS = frozenset({"start_step", "end_step"})
# Bounds: a number no launcher, timer or database can take is refused here, not half-way through.
MAX_CPUS = 1024.0
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_WEBHOOK_RETRIES = 10
MAX_GRACE_SECONDS = 3600.0
RULE_REFERENCE = (  # 'package.module:Class' (dotted identifiers), or a rule / entry-point name
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$|^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"
)
CONFIGURATION_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"  # it names files and component roles: no '/', no '..'
COMPARISONS = (
    "GreaterThanOrEqualToThreshold",
    "GreaterThanThreshold",
    "LessThanThreshold",
    "LessThanOrEqualToThreshold",
)


def _shape(shape: Any, value: Any) -> None:
    """SageMaker's shape of a member (sagemaker_validation), as one ValueError."""
    errors = member_errors(shape, value)
    if errors:
        raise ValueError("; ".join(errors[:5]))


_HOOK_LOCATIONS = structure(DEBUG_HOOK_LOCATIONS)


_STRICT = ConfigDict(extra="forbid", strict=True)


class Resources(BaseModel):
    model_config = _STRICT

    cpus: float | None = Field(
        None, gt=0, le=MAX_CPUS, allow_inf_nan=False, description="CPU limit in cores (fractions allowed)"
    )
    memory_mb: int | None = Field(None, gt=0, le=MAX_MEMORY_MB, description="memory limit in MiB")
    gpus: int | None = Field(None, ge=0, le=16, description="GPUs per instance (requested from Ray)")
    instance_count: int = Field(
        1, ge=1, le=64, description="training instances; more than one runs on the ray launcher only"
    )

    @field_validator("cpus")
    @classmethod
    def _grantable_cpus(cls, value: float | None) -> float | None:
        if value is not None and value < MIN_CPUS:
            raise ValueError(f"must be at least {MIN_CPUS} cores (the smallest CPU limit an engine grants)")
        return value

    @field_validator("memory_mb")
    @classmethod
    def _grantable_memory(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_MEMORY_MB:
            raise ValueError(f"must be at least {MIN_MEMORY_MB} MiB (the smallest memory limit docker grants)")
        return value


class StoppingCondition(BaseModel):
    model_config = _STRICT

    max_runtime_seconds: int | None = Field(
        None, gt=0, le=MAX_RUNTIME_SECONDS, description="stop the job after this many seconds (at most 28 days)"
    )


def _number(action: dict[str, Any], key: str, index: int, low: float, high: float, *, integer: bool) -> None:
    value = action.get(key)
    if value is None or (isinstance(value, str) and value == ""):
        return
    if isinstance(value, str):  # action_json from the SDK carries numbers as text
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            raise ValueError(f"action {index}: {key}={value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"action {index}: {key} must be a number, not {type(value).__name__}")
    if integer and not isinstance(value, int):
        raise ValueError(f"action {index}: {key}={value!r} must be an integer")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"action {index}: {key}={value!r} must be between {low:g} and {high:g}")


def _string_member(action: dict[str, Any], key: str, index: int, max_length: int = 2048) -> None:
    value = action.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > max_length):
        raise ValueError(f"action {index}: {key} must be a string of at most {max_length} characters")


def _validate_actions(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from trainguard.services.actions import action_names
    from trainguard.services.actions.validation import check_action_fields

    known = action_names()
    if len(actions) > 10:
        raise ValueError(f"at most 10 actions, got {len(actions)}")
    check_document_size(actions, "actions")
    for index, action in enumerate(actions):
        safe_tree(action, f"action {index}")
        if not isinstance(action, dict):
            raise ValueError(f"action {index}: must be an object with a 'name'")
        if not isinstance(action.get("name"), str):
            raise ValueError(f"action {index}: 'name' must be a string; valid: {', '.join(sorted(known))}")
        name = action["name"].lower()
        if name not in known:
            raise ValueError(f"action {index}: unknown name {action.get('name')!r}; valid: {', '.join(sorted(known))}")
        for key in ("url", "endpoint", "topic_arn", "training_job_prefix"):
            _string_member(action, key, index)
        _number(action, "retries", index, 0, MAX_WEBHOOK_RETRIES, integer=True)
        _number(action, "grace_seconds", index, 0, MAX_GRACE_SECONDS, integer=False)
        headers = action.get("headers")
        if headers is not None and (
            not isinstance(headers, dict)
            or len(headers) > 20
            or not all(isinstance(v, str) and len(v) <= 2048 for v in headers.values())
        ):
            raise ValueError(f"action {index}: headers must be a map of at most 20 strings")
        if name == "webhook":
            url = action.get("url") or ""
            if not url:
                raise ValueError(f"action {index}: webhook needs 'url'")
            if not url.lower().startswith(("http://", "https://")):
                raise ValueError(f"action {index}: webhook url must be http:// or https://, got {url[:64]!r}")
        if name in ("email", "sms") and not action.get("endpoint"):
            raise ValueError(f"action {index}: {name} needs 'endpoint' (an address or phone number)")
        if name == "sns" and not action.get("topic_arn"):
            raise ValueError(f"action {index}: sns needs 'topic_arn'")
        try:  # line breaks and control characters in URLs, headers and addresses (services/actions)
            check_action_fields(action)
        except ValueError as error:
            raise ValueError(f"action {index}: {error}") from None
    return actions


def _step(parameters: dict[str, Any], key: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (
        isinstance(value, str) and not (value.strip().isascii() and value.strip().isdigit())
    ):
        raise ValueError(f"parameters.{key}: must be a non-negative integer step, got {value!r}")
    if isinstance(value, str) and len(value.strip()) > len(str(MAX_STEP)):
        raise ValueError(f"parameters.{key}: {value.strip()[:24]}... is too large (at most {MAX_STEP})")
    step = int(value)
    if step < 0:
        raise ValueError(f"parameters.{key}: must be a non-negative integer step, got {value!r}")
    if step > MAX_STEP:
        raise ValueError(f"parameters.{key}: {step} is too large (at most {MAX_STEP})")
    return step


class _Unopened:
    """An other-trial path during validation (rules open only string paths)."""

    def __init__(self, path: str) -> None:
        self.path = path.strip()


class RuleConfig(BaseModel):
    model_config = _STRICT

    rule: Annotated[str, SafeText(512, 1)] = Field(
        description="built-in rule name, entry-point name or 'package.module:Class'"
    )
    name: Annotated[str, SafeText(MAX_RULE_CONFIGURATION_NAME, 1, CONFIGURATION_NAME)] | None = Field(
        None,
        description=f"RuleConfigurationName (default: the rule name); letters, digits, '_', '.', '-'; at most "
        f"{MAX_RULE_CONFIGURATION_NAME} characters (the rule's files and processes are named after it)",
    )
    parameters: dict[Annotated[str, SafeText(256, 1)], Annotated[str, SafeText(4096)] | int | float | bool] = Field(
        default_factory=dict, max_length=100
    )
    actions: list[dict[str, Any]] = Field(default_factory=list, description="e.g. [{'name': 'stoptraining'}]")
    kind: Literal["debug", "profiler"] = "debug"
    source_uri: Annotated[str, SafeText(1024)] | None = Field(
        None, description="a .py file (s3:// or path) that defines the custom rule class"
    )

    @property
    def configuration_name(self) -> str:
        return self.name or self.rule.rpartition(":")[2]

    @model_validator(mode="after")
    def _name_fits(self) -> RuleConfig:
        if self.name is None and len(self.configuration_name) > MAX_RULE_CONFIGURATION_NAME:
            raise ValueError(
                f"name: the rule's configuration name (its class name) is longer than {MAX_RULE_CONFIGURATION_NAME}"
                " characters; give a shorter 'name'"
            )
        return self

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        import re

        value = value.strip()
        if not value:
            raise ValueError("empty rule name")
        if not re.match(RULE_REFERENCE, value):
            raise ValueError(f"{value[:64]!r} is neither a rule name nor 'package.module:Class'")
        return value

    @field_validator("parameters")
    @classmethod
    def _finite_parameters(cls, value: dict[str, Any]) -> dict[str, Any]:
        safe_tree(value)
        check_document_size(value, "parameters")
        start, end = _step(value, "start_step"), _step(value, "end_step")
        if start is not None and end is not None and end < start:
            raise ValueError(f"end_step={end} is before start_step={start}")
        return value

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _validate_actions(value)

    @model_validator(mode="after")
    def _rule_and_parameters(self) -> RuleConfig:
        if self.source_uri or ":" in self.rule:
            # A job's own file is loaded by its runner; a 'module:Class' is imported only after the
            # server's policy allowed its module (JobService.create calls check_rule_class then).
            return self
        check_rule_class(self)
        return self


def check_rule_class(config: RuleConfig) -> None:
    """Load the rule class and let it check its parameters; ValueError 'rule: ...' / 'parameters: ...'."""
    from trainguard.errors import ConfigError
    from trainguard.rules import Rule, get_rule_class

    try:
        rule_class = get_rule_class(config.rule)
    except ConfigError as error:
        raise ValueError(f"rule: {error}") from None
    except Exception as error:  # noqa: BLE001 - an import that fails any other way is still a bad reference
        raise ValueError(f"rule: cannot load {config.rule!r}: {type(error).__name__}: {error}") from None
    skipped = RUNNER_PARAMETERS | {"other_trials", "action_json"}
    parameters = {k: v for k, v in config.parameters.items() if k not in skipped}
    # A rule opens its other trials when built (a wait per run): validate with unopened
    # stand-ins; the paths are opened by the rule runner.
    others = [_Unopened(p) for p in str(config.parameters.get("other_trials") or "").split(",") if p.strip()]
    if isinstance(rule_class, type) and issubclass(rule_class, Rule):
        strings = {k: str(v) if not isinstance(v, str) else v for k, v in parameters.items()}
        for name, text in strings.items():
            if nesting_problem(text):  # before a rule compiles it as a regex
                raise ValueError(f"parameters: {name} {nesting_problem(text)}")
        try:
            rule_class(None, other_trials=others, **strings)
        except ConfigError as error:
            raise ValueError(f"parameters: {error}") from None
        except RecursionError:  # Python's regex parser recurses once per nested group
            raise ValueError("parameters: a value is nested too deeply to parse (a regex?)") from None
        except Exception:  # noqa: BLE001 - a rule that needs a trial to construct is checked at run time
            pass


def _check_nesting(value: Any) -> None:
    """ValueError naming the first string of a hook config nested too deeply to compile as a regex."""
    if isinstance(value, str):
        if nesting_problem(value):
            raise ValueError(f"a value {nesting_problem(value)} (a regex compiled in the job)")
    elif isinstance(value, dict):
        for member in value.values():
            _check_nesting(member)
    elif isinstance(value, list):
        for member in value:
            _check_nesting(member)


class AlarmConfig(BaseModel):
    """A CloudWatch-style alarm on a rule metric, evaluated by trainguard itself."""

    model_config = _STRICT

    name: Annotated[str, SafeText(256, 1)]
    metric_name: Literal["RuleIssuesFound"] = "RuleIssuesFound"
    rule: Annotated[str, SafeText(256, 1)] | None = Field(
        None, description="RuleConfigurationName the alarm watches (default: every rule)"
    )
    threshold: float = Field(1.0, allow_inf_nan=False, ge=-1e12, le=1e12)
    comparison: Literal[COMPARISONS] = "GreaterThanOrEqualToThreshold"  # type: ignore[valid-type]
    evaluation_periods: int = Field(1, ge=1, le=100, description="M: how many latest datapoints are evaluated")
    datapoints_to_alarm: int | None = Field(None, ge=1, le=100, description="N of M breaching datapoints (default M)")
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

    model_config = _STRICT

    name: str = Field(pattern=JOB_NAME_PATTERN, description="1-63 characters: letters, digits, hyphens")
    image: Annotated[str, SafeText(1024, 1)] | None = Field(
        None, description="training image (docker launcher; ignored by the local one)"
    )
    command: list[Annotated[str, SafeText(65536)]] = Field(
        default_factory=list, max_length=1000, description="the training command, e.g. ['python', 'train.py']"
    )
    environment: dict[
        Annotated[str, SafeText(512, 1, r"^[A-Za-z_][A-Za-z0-9_]*$")], Annotated[str, SafeText(262144)]
    ] = Field(default_factory=dict, max_length=500)
    working_dir: Annotated[str, SafeText(4096, 1)] | None = Field(
        None, description="working directory of the training command"
    )
    resources: Resources = Field(default_factory=lambda: Resources.model_validate({}))
    hook_config: dict[str, Any] | None = Field(None, description="SageMaker DebugHookConfig object")
    rules: list[RuleConfig] = Field(default_factory=list, max_length=40)
    profiler_config: dict[str, Any] | None = Field(None, description="SageMaker ProfilerConfig object")
    stopping_condition: StoppingCondition = Field(default_factory=lambda: StoppingCondition.model_validate({}))
    alarms: list[AlarmConfig] = Field(default_factory=list, max_length=20)

    @field_validator("command")
    @classmethod
    def _exec_command(cls, value: list[str]) -> list[str]:
        check_command(value)
        return value

    @field_validator("environment")
    @classmethod
    def _exec_environment(cls, value: dict[str, str]) -> dict[str, str]:
        check_environment(value)
        return value

    @field_validator("profiler_config")
    @classmethod
    def _safe_profiler_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        safe_tree(value)
        _shape(PROFILER_CONFIG, value)  # SageMaker's ProfilerConfig, as the training side reads it
        check_document_size(value, "profiler_config")
        return value

    @field_validator("hook_config")
    @classmethod
    def _valid_hook_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        safe_tree(value)
        _shape(_HOOK_LOCATIONS, value)  # S3OutputPath and LocalPath are read as strings by the planner
        check_document_size(value, "hook_config")
        _check_nesting(value)  # its regexes (HookParameters', collections') compile in the job
        from trainguard.config.collections import compile_regex
        from trainguard.config.json_config import hook_kwargs_from_document
        from trainguard.errors import ConfigError

        try:
            kwargs = hook_kwargs_from_document({k: v for k, v in value.items() if k != "S3OutputPath"})
            # The hook compiles these with Python's re when it starts (in the job's own process).
            for pattern in kwargs.get("include_regex") or []:
                compile_regex(pattern, "HookParameters.include_regex")
        except ConfigError as error:
            raise ValueError(str(error)) from None
        except (TypeError, AttributeError, KeyError, ValueError) as error:  # a member of the wrong type
            raise ValueError(f"malformed hook config: {type(error).__name__}: {error}") from None
        except RecursionError:  # Python's regex parser recurses once per nested group
            raise ValueError("an include_regex is nested too deeply to compile") from None
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
