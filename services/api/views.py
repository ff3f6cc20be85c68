"""Rows -> documents: the native job description and SageMaker's DescribeTrainingJob shape."""

from __future__ import annotations

import json
from typing import Any

from trainguard.services.api.db import ActionRow, AlarmRow, ComponentRow, JobRow, RuleRow, TransitionRow

__all__ = ["native_description", "rule_parameters_for_request", "sagemaker_description", "sagemaker_summary"]


def _fix_hint_of(rule: RuleRow) -> str:
    for finding in reversed(rule.findings or []):
        if finding.get("fix_hint"):
            return str(finding["fix_hint"])
    return rule.fix_hint


def _advice_only(rule: RuleRow) -> bool:
    """The rule's findings are all advice (trainguard.rules.advice): a property of the data or the
    initialisation, reported with status NoIssuesFound (details ``Advice: ...``), not an issue."""
    fired = [finding for finding in rule.findings or [] if finding.get("fired", True)]
    return bool(fired) and all(finding.get("advice") for finding in fired)


def native_description(
    job: JobRow,
    transitions: list[TransitionRow],
    components: list[ComponentRow],
    rules: list[RuleRow],
    alarms: list[AlarmRow],
    actions: list[ActionRow],
) -> dict[str, Any]:
    return {
        "name": job.name,
        "arn": job.arn,
        "source": job.source,
        "launcher": job.launcher,
        "owner": job.owner,
        "status": job.status,
        "secondary_status": job.secondary_status,
        "failure_reason": job.failure_reason or None,
        "exit_code": job.exit_code,
        "stop_cause": job.stop_cause or None,
        "creation_time": job.creation_time,
        "training_start_time": job.training_start_time,
        "training_end_time": job.training_end_time,
        "last_modified_time": job.last_modified_time,
        "secondary_status_transitions": [
            {"status": t.status, "start_time": t.start_time, "end_time": t.end_time, "message": t.message}
            for t in transitions
        ],
        "components": [
            {"role": c.role, "state": c.state, "exit_code": c.exit_code, "reason": c.reason} for c in components
        ],
        "rules": [
            {
                "configuration_name": r.configuration_name,
                "rule": r.rule,
                "kind": r.kind,
                "status": r.status,
                "status_details": r.status_details or None,
                "last_evaluated_step": r.last_evaluated_step,
                "findings": r.findings or [],
                "advice": _advice_only(r),
                "missing": r.missing or [],
                "fix_hint": _fix_hint_of(r) or None,
                "evaluation_job_arn": r.evaluation_job_arn,
                "last_modified_time": r.last_modified_time,
            }
            for r in rules
        ],
        "alarms": [{"name": a.name, "state": a.state, "reason": a.state_reason, **a.spec} for a in alarms],
        "actions": [
            {
                "alarm": a.alarm_name,
                "action": a.action_name,
                "status": a.status,
                "detail": a.detail,
                "created": a.created,
                "finished": a.finished,
            }
            for a in actions
        ],
        "spec": job.spec,
    }


def rule_parameters_for_request(rule: dict[str, Any]) -> dict[str, str]:
    """A native rule config as SageMaker RuleParameters (strings, rule_to_invoke, action_json)."""
    parameters = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (rule.get("parameters") or {}).items()}
    parameters["rule_to_invoke"] = rule["rule"]
    if rule.get("actions"):
        parameters["action_json"] = json.dumps(rule["actions"])
    if rule.get("source_uri"):
        parameters["source_s3_uri"] = rule["source_uri"]
    return parameters


def _rule_status_entry(rule: RuleRow) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "RuleConfigurationName": rule.configuration_name,
        "RuleEvaluationJobArn": rule.evaluation_job_arn,
        "RuleEvaluationStatus": rule.status,
        "LastModifiedTime": rule.last_modified_time,
    }
    if rule.status_details:
        entry["StatusDetails"] = rule.status_details[:1024]
    return entry


def _training_seconds(job: JobRow) -> dict[str, int]:
    """SageMaker's TrainingTimeInSeconds and BillableTimeInSeconds of an ended job (whole seconds).

    Both are the wall-clock time from the training's start to its end: trainguard has no
    provisioning or spot discount to take off. A job that ended before its training started ran 0 s.
    The SDK's ``logs()`` prints them (times InstanceCount) when a job ends.
    """
    start, end = job.training_start_time, job.training_end_time
    seconds = 0 if start is None or end is None else max(0, round(end - start))
    return {"TrainingTimeInSeconds": seconds, "BillableTimeInSeconds": seconds}


def sagemaker_description(
    job: JobRow, transitions: list[TransitionRow], rules: list[RuleRow], service_image: str
) -> dict[str, Any]:
    spec = job.spec
    request = job.request or {}
    hook_config = request.get("DebugHookConfig") or spec.get("hook_config")
    output = (
        (request.get("OutputDataConfig") or {}).get("S3OutputPath") or (hook_config or {}).get("S3OutputPath") or ""
    )
    max_runtime = (spec.get("stopping_condition") or {}).get("max_runtime_seconds")
    description: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "ModelArtifacts": {
            "S3ModelArtifacts": f"{output.rstrip('/')}/{job.name}/output/model.tar.gz" if output else ""
        },
        "TrainingJobStatus": job.status,
        "SecondaryStatus": job.secondary_status,
        "StoppingCondition": request.get("StoppingCondition")
        or ({"MaxRuntimeInSeconds": max_runtime} if max_runtime else {}),
        "CreationTime": job.creation_time,
        "LastModifiedTime": job.last_modified_time,
        "AlgorithmSpecification": request.get("AlgorithmSpecification")
        or {
            "TrainingImage": spec.get("image") or "",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": spec.get("command") or [],
        },
        "SecondaryStatusTransitions": [
            {
                k: v
                for k, v in (
                    ("Status", t.status),
                    ("StartTime", t.start_time),
                    ("EndTime", t.end_time),
                    ("StatusMessage", t.message),
                )
                if v not in (None, "")
            }  # fmt: skip
            for t in transitions
        ],
    }
    for key in (
        "RoleArn",
        "OutputDataConfig",
        "ResourceConfig",
        "HyperParameters",
        "Environment",
        "TensorBoardOutputConfig",
    ):
        if key in request:
            description[key] = request[key]
    if job.training_start_time is not None:
        description["TrainingStartTime"] = job.training_start_time
    if job.training_end_time is not None:
        description["TrainingEndTime"] = job.training_end_time
        description.update(_training_seconds(job))
    if job.failure_reason:
        description["FailureReason"] = job.failure_reason[:1024]
    if hook_config is not None:
        description["DebugHookConfig"] = hook_config
    debug_rules = [r for r in rules if r.kind == "debug"]
    profiler_rules = [r for r in rules if r.kind == "profiler"]
    if "DebugRuleConfigurations" in request:
        description["DebugRuleConfigurations"] = request["DebugRuleConfigurations"]
    elif spec.get("rules"):
        description["DebugRuleConfigurations"] = [
            {
                "RuleConfigurationName": rule.get("name") or rule["rule"].rpartition(":")[2],
                "RuleEvaluatorImage": service_image,
                "RuleParameters": rule_parameters_for_request(rule),
            }
            for rule in spec["rules"]
            if rule.get("kind", "debug") == "debug"
        ]
    if debug_rules:
        description["DebugRuleEvaluationStatuses"] = [_rule_status_entry(r) for r in debug_rules]
    if "ProfilerConfig" in request or spec.get("profiler_config") is not None:
        profiler = request.get("ProfilerConfig") or spec.get("profiler_config") or {}
        description["ProfilerConfig"] = profiler
        description["ProfilingStatus"] = "Disabled" if profiler.get("DisableProfiler") else "Enabled"
    if "ProfilerRuleConfigurations" in request:
        description["ProfilerRuleConfigurations"] = request["ProfilerRuleConfigurations"]
    if profiler_rules:
        description["ProfilerRuleEvaluationStatuses"] = [_rule_status_entry(r) for r in profiler_rules]
    return description


def sagemaker_summary(job: JobRow) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "CreationTime": job.creation_time,
        "TrainingJobStatus": job.status,
        "SecondaryStatus": job.secondary_status,
        "LastModifiedTime": job.last_modified_time,
    }
    if job.training_end_time is not None:
        summary["TrainingEndTime"] = job.training_end_time
    return summary
