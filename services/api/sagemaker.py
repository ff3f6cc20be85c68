"""SageMaker CreateTrainingJob request -> trainguard job spec, accepting the SDK's quirks.

* ``RuleParameters`` are all strings; ``rule_to_invoke`` names the rule (default: the
  configuration name); ``action_json`` arrives with escaped quotes (parsed both ways).
* AWS rule images (``sagemaker-debugger-rules``, ``sagemaker-debugger-rule-evaluator``,
  ``detailed-profiler-processing``) and any other RuleEvaluatorImage run on trainguard's rule
  runner; custom rules come as ``source_s3_uri`` + ``rule_to_invoke``.
* Repeated ``CollectionName`` entries are merged by the hook config parser (last value wins,
  ``include_regex`` accumulates), as smdebug does.
* Profiler rules trainguard does not have (``ProfilerReport``, ``DetailedProfilerProcessing``
  auto-added by the SDK) are accepted and reported as ``Error`` with the reason, not rejected.
* ``other_trial_0..N`` become the rule's ``other_trials`` (comma-separated, in index order).
* The training runs under SageMaker's container contract (``trainguard.services.sagemaker_container``):
  the SDK's ``sagemaker_program``/``sagemaker_submit_directory`` jobs and explicit
  ``ContainerEntrypoint`` jobs alike get ``/opt/ml``, their channels and their outputs.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import ValidationError
from trainguard.services.actions import parse_action_json
from trainguard.services.api.schemas import JobSpec
from trainguard.services.errors import ServiceError
from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, ContractError, contract_from_request

__all__ = ["SageMakerError", "job_spec_from_request", "validation_message"]

log = logging.getLogger("trainguard.sagemaker")
AWS_RULE_IMAGES = re.compile(
    r"(sagemaker-debugger-rules|sagemaker-debugger-rule-evaluator|detailed-profiler-processing)"
)
_OTHER_TRIAL = re.compile(r"^other_trial_\d+$")
# The job-side runner of SageMaker's container contract (services/sagemaker_container).
CONTRACT_RUNNER = ("python", "-m", "trainguard.services.sagemaker_container")


class SageMakerError(ServiceError):
    """An awsJson error: ``code`` goes to ``__type``."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def _rule_entry(config: dict[str, Any], kind: str, label: str) -> dict[str, Any]:
    name = config.get("RuleConfigurationName")
    if not name:
        raise SageMakerError("ValidationException", f"{label}.RuleConfigurationName is required")
    parameters = {str(k): str(v) for k, v in (config.get("RuleParameters") or {}).items()}
    rule = parameters.pop("rule_to_invoke", "") or name
    actions: list[dict[str, Any]] = []
    if "action_json" in parameters:
        try:
            actions = parse_action_json(parameters.pop("action_json"))
        except ValueError as error:
            raise SageMakerError("ValidationException", f"{label}.RuleParameters.action_json: {error}") from None
    # The SDK sends other_trial_0..N (pre-GA configs: other_trials); rules take other_trials.
    numbered = sorted((int(k.rpartition("_")[2]), k) for k in parameters if _OTHER_TRIAL.match(k))
    if numbered:
        paths = [parameters.pop(key) for _, key in numbered]
        parameters["other_trials"] = ",".join([*filter(None, [parameters.get("other_trials", "")]), *paths])
    source = parameters.pop("source_s3_uri", None)
    image = str(config.get("RuleEvaluatorImage") or "")
    if image and not AWS_RULE_IMAGES.search(image):
        log.info("%s: RuleEvaluatorImage %s runs on trainguard's rule runner", label, image)
    entry: dict[str, Any] = {"rule": rule, "name": name, "parameters": parameters, "actions": actions, "kind": kind}
    if source:
        entry["source_uri"] = source
    return entry


def _rule_available(rule: str) -> str:
    """'' when trainguard can run ``rule``, else the reason it cannot."""
    from trainguard.errors import ConfigError
    from trainguard.rules import get_rule_class

    if ":" in rule:
        return ""  # 'module:Class' is never imported here: the server's policy decides it at creation
    try:
        get_rule_class(rule)
    except ConfigError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - a reference that fails to import any other way
        return f"cannot load {rule!r}: {type(error).__name__}: {error}"
    return ""


def job_spec_from_request(request: dict[str, Any]) -> tuple[JobSpec, list[dict[str, str]], dict[int, str]]:
    """(spec, profiler rules trainguard cannot run, rule index -> request member label)."""
    name = request.get("TrainingJobName")
    if not name:
        raise SageMakerError("ValidationException", "TrainingJobName is required")
    algorithm = request.get("AlgorithmSpecification") or {}
    # Every SageMaker job runs through SageMaker's training-container contract (the /opt/ml tree,
    # channels, SM_* variables, the SDK's source and program, model.tar.gz and the failure file):
    # the job-side runner gets the contract in its environment and runs the training itself.
    try:
        contract = contract_from_request(request)
    except ContractError as error:
        raise SageMakerError("ValidationException", str(error)) from None
    command = list(CONTRACT_RUNNER)
    environment = {str(k): str(v) for k, v in (request.get("Environment") or {}).items()}
    environment[CONTRACT_ENV] = contract.to_json()
    rules: list[dict[str, Any]] = []
    labels: dict[int, str] = {}
    unavailable: list[dict[str, str]] = []
    for index, config in enumerate(request.get("DebugRuleConfigurations") or []):
        labels[len(rules)] = f"DebugRuleConfigurations[{index}]"
        rules.append(_rule_entry(config, "debug", labels[len(rules)]))
    for index, config in enumerate(request.get("ProfilerRuleConfigurations") or []):
        label = f"ProfilerRuleConfigurations[{index}]"
        entry = _rule_entry(config, "profiler", label)
        reason = "" if entry.get("source_uri") else _rule_available(entry["rule"])
        if reason:
            unavailable.append(
                {"name": entry["name"], "rule": entry["rule"], "kind": "profiler",
                 "reason": f"RuleNotAvailable: trainguard cannot run this profiler rule: {reason}"[:1024]}
            )  # fmt: skip
            continue
        labels[len(rules)] = label
        rules.append(entry)
    hook_config = _without_unknown_collections(request.get("DebugHookConfig"), name)
    max_runtime = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
    document = {
        "name": name,
        "image": algorithm.get("TrainingImage") or None,
        "command": command,
        "environment": environment,
        "hook_config": hook_config,
        "rules": rules,
        "profiler_config": request.get("ProfilerConfig"),
        "stopping_condition": {"max_runtime_seconds": max_runtime},
    }
    try:
        spec = JobSpec.model_validate(document)
    except ValidationError as error:
        raise SageMakerError("ValidationException", validation_message(error, labels)) from None
    return spec, unavailable, labels


def _without_unknown_collections(hook_config: Any, job: str) -> Any:
    """The DebugHookConfig without the collections no hook fills (a name that is not built in and
    has no include_regex). SageMaker accepts those (smdebug makes an empty collection of them), so
    an SDK job naming one must start here too; the native API refuses them as the typo they
    usually are."""
    if not isinstance(hook_config, dict) or not isinstance(hook_config.get("CollectionConfigurations"), list):
        return hook_config
    from trainguard.config.collection_names import unknown_collections

    entries = hook_config["CollectionConfigurations"]
    named = [entry.get("CollectionName") for entry in entries if isinstance(entry, dict)]
    defined = [
        entry.get("CollectionName") for entry in entries
        if isinstance(entry, dict) and isinstance(entry.get("CollectionParameters"), dict)
        and entry["CollectionParameters"].get("include_regex")
    ]  # fmt: skip
    unknown = set(
        unknown_collections([n for n in named if isinstance(n, str)], [d for d in defined if isinstance(d, str)])
    )
    if not unknown:
        return hook_config
    log.warning("job %s: DebugHookConfig collection(s) %s match nothing (not built in, no include_regex): "
                "not captured", job, ", ".join(sorted(unknown)))  # fmt: skip
    kept = [e for e in entries if not (isinstance(e, dict) and e.get("CollectionName") in unknown)]
    return {**hook_config, "CollectionConfigurations": kept}


_MEMBERS = {
    "name": "TrainingJobName",
    "hook_config": "DebugHookConfig",
    "command": "AlgorithmSpecification.ContainerEntrypoint",
    "image": "AlgorithmSpecification.TrainingImage",
    "profiler_config": "ProfilerConfig",
    "stopping_condition": "StoppingCondition",
    "max_runtime_seconds": "MaxRuntimeInSeconds",
    "parameters": "RuleParameters",
    "actions": "RuleParameters.action_json",
    "rule": "RuleParameters.rule_to_invoke",
}


def validation_message(error: ValidationError, labels: dict[int, str]) -> str:
    """Pydantic errors in SageMaker's member names: 'DebugRuleConfigurations[0]: rule: unknown rule...'."""
    parts = []
    for item in error.errors():
        location = list(item.get("loc", ()))
        words: list[str] = []
        index = 0
        while index < len(location):
            part = location[index]
            following = location[index + 1] if index + 1 < len(location) else None
            if part == "rules" and isinstance(following, int):
                words.append(labels.get(following, f"DebugRuleConfigurations[{following}]"))
                index += 2
                continue
            words.append(_MEMBERS.get(str(part), str(part)))
            index += 1
        message = str(item.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{'.'.join(words) or 'request'}: {message}")
    return "; ".join(parts)
