"""Type and bound checks of SageMaker requests, before anything reads them.

boto3 validates requests on the client side; other clients (curl, other SDKs, an attacker) do
not. Every member trainguard reads is checked here against the service model's type and limits
(/work/shared/reference/sagemaker-api.md section 2), so that a wrong type is a
``ValidationException`` naming the member, never a crash deep in the translation. Unknown members
are ignored, as SageMaker's own JSON protocol does for members a server version does not model.

Messages follow SageMaker's wording: ``1 validation error detected: Value 'abc' at 'MaxResults'
failed to satisfy constraint: Member must be an integer``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from trainguard.services.errors import ServiceError

__all__ = [
    "DEBUG_HOOK_LOCATIONS",
    "JOB_NAME",
    "MAX_RULE_CONFIGURATION_NAME",
    "PROFILER_CONFIG",
    "RequestInvalid",
    "check_create_request",
    "check_list_request",
    "check_name_request",
    "member_errors",
    "unsafe_text",
]

JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_NAME_CONTAINS = re.compile(r"^[a-zA-Z0-9\-]+$")
_ENVIRONMENT_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NEXT_TOKEN = re.compile(r"^[0-9]{1,9}$")
MAX_RUNTIME_SECONDS = 28 * 24 * 3600  # SageMaker's documented maximum (28 days)
# SageMaker allows 256; trainguard names a rule's files, processes and containers after it
# (``rule--<name>``, ``<name>.json``), and a file name has at most 255 bytes.
MAX_RULE_CONFIGURATION_NAME = 200
_JOB_STATUSES = ("InProgress", "Completed", "Failed", "Stopping", "Stopped", "Deleting")

Check = Callable[[Any, str, list[str]], None]


class RequestInvalid(ServiceError, ValueError):
    """The request breaks the model; ``message`` is the whole ValidationException text."""


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    text = text if len(text) <= 64 else text[:61] + "..."
    return text.encode("unicode_escape").decode("ascii")


def _fail(errors: list[str], value: Any, path: str, constraint: str) -> None:
    errors.append(f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: Member must {constraint}")


def unsafe_text(text: str) -> str:
    """'' when ``text`` can be stored and passed on, else what is wrong with it (NUL, lone surrogate)."""
    if "\x00" in text:
        return "not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "be valid Unicode (no lone surrogates)"
    return ""


def _unsafe_strings(value: Any, path: str, errors: list[str], depth: int = 0) -> None:
    """NUL bytes and lone surrogates anywhere (keys included) cannot reach a process or a database."""
    if depth > 64:
        _fail(errors, "...", path, "be nested at most 64 levels deep")
    elif isinstance(value, str):
        problem = unsafe_text(value)
        if problem:
            _fail(errors, value, path, problem)
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = unsafe_text(key)
            if problem:
                errors.append(
                    f"Value '{_shown(key)}' at '{path or 'request'}' failed to satisfy constraint: "
                    f"Member names must {problem}"
                )
                continue
            _unsafe_strings(item, f"{path}.{key}" if path else key, errors, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _unsafe_strings(item, f"{path}[{index}]", errors, depth + 1)


# -- checkers: each appends messages to ``errors`` and returns nothing ------------------------------
def string(min_length: int = 0, max_length: int = 1024, pattern: re.Pattern[str] | None = None) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, str):
            _fail(errors, value, path, "be a string")
        elif not min_length <= len(value) <= max_length:
            _fail(errors, value, path, f"have length between {min_length} and {max_length}")
        elif pattern is not None and not pattern.match(value):
            _fail(errors, value, path, f"satisfy regular expression pattern: {pattern.pattern}")

    return check


def integer(low: int, high: int) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(errors, value, path, "be an integer")
        elif not low <= value <= high:
            _fail(errors, value, path, f"have value between {low} and {high}")

    return check


def boolean(value: Any, path: str, errors: list[str]) -> None:
    if not isinstance(value, bool):
        _fail(errors, value, path, "be a boolean")


def timestamp(value: Any, path: str, errors: list[str]) -> None:
    """awsJson timestamps are epoch seconds (boto3 sends a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(errors, value, path, "be a timestamp (seconds since the epoch)")
    elif not 0 <= value <= 253402300799:  # up to 9999-12-31
        _fail(errors, value, path, "be a timestamp between 1970 and 9999")


def enum(*values: str) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if value not in values:
            _fail(errors, value, path, f"satisfy enum value set: [{', '.join(values)}]")

    return check


def string_map(max_entries: int, key: Check, value: Check) -> Check:
    def check(document: Any, path: str, errors: list[str]) -> None:
        if not isinstance(document, dict):
            _fail(errors, document, path, "be a map of strings to strings")
            return
        if len(document) > max_entries:
            _fail(errors, f"{len(document)} entries", path, f"have at most {max_entries} entries")
            return
        for name, item in document.items():
            key(name, f"{path}.{name}", errors)
            value(item, f"{path}.{name}", errors)

    return check


def all_of(*checks: Check) -> Check:
    """Each check in turn, up to the first that fails (a later one may assume the earlier held)."""

    def check(value: Any, path: str, errors: list[str]) -> None:
        for each in checks:
            before = len(errors)
            each(value, path, errors)
            if len(errors) > before:
                return

    return check


def linear_regex(value: Any, path: str, errors: list[str]) -> None:
    """A regex the API runs itself: it must compile in RE2, the linear-time engine (job_metrics)."""
    from trainguard.services.api.job_metrics import metric_regex_problem

    problem = metric_regex_problem(value)
    if problem:
        _fail(errors, value, path, f"be a regular expression the server can run: {problem}")


def list_of(item: Check, min_items: int = 0, max_items: int = 100) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, list):
            _fail(errors, value, path, "be a list")
            return
        if not min_items <= len(value) <= max_items:
            _fail(errors, f"{len(value)} items", path, f"have between {min_items} and {max_items} items")
            return
        for index, element in enumerate(value):
            item(element, f"{path}[{index}]", errors)

    return check


def structure(members: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            _fail(errors, value, path or "request", "be a JSON object (structure)")
            return
        for name in required:
            if value.get(name) is None:
                errors.append(
                    f"Value null at '{_join(path, name)}' failed to satisfy constraint: Member must not be null"
                )
        for name, member in members.items():
            if value.get(name) is not None:  # null = absent, as botocore's JSON parser treats it
                member(value[name], _join(path, name), errors)

    return check


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- the shapes trainguard reads (limits from the service model) -----------------------------------
S3_URI = string(0, 1024, re.compile(r"^(https|s3)://([^/]+)/?(.*)$"))
DIRECTORY = string(0, 4096)
CONFIG_MAP = string_map(20, string(1, 256), string(0, 256))
PROFILER_CONFIG = structure(
    {
        "S3OutputPath": S3_URI,
        "ProfilingIntervalInMilliseconds": integer(1, 3_600_000),
        "ProfilingParameters": CONFIG_MAP,
        "DisableProfiler": boolean,
    }
)
# Where a DebugHookConfig's data goes: read by the planner and the uploader as strings.
DEBUG_HOOK_LOCATIONS: dict[str, Check] = {"S3OutputPath": S3_URI, "LocalPath": DIRECTORY}
_RULE = structure(
    {
        "RuleConfigurationName": string(1, MAX_RULE_CONFIGURATION_NAME),
        "RuleEvaluatorImage": string(0, 255),
        "LocalPath": DIRECTORY,
        "S3OutputPath": S3_URI,
        "InstanceType": string(0, 64),
        "VolumeSizeInGB": integer(0, 16384),
        # SageMaker allows 256 characters per value; trainguard's action_json (webhook URLs and
        # headers) and other_trials paths may need more.
        "RuleParameters": string_map(100, string(1, 256), string(0, 4096)),
    },
    required=("RuleConfigurationName",),
)
_CREATE = structure(
    {
        "TrainingJobName": string(1, 63, JOB_NAME),
        "RoleArn": string(0, 2048),
        "AlgorithmSpecification": structure(
            {
                "TrainingImage": string(0, 255),
                "AlgorithmName": string(0, 170),
                "TrainingInputMode": enum("Pipe", "File", "FastFile"),
                "ContainerEntrypoint": list_of(string(1, 256), 1, 100),
                "ContainerArguments": list_of(string(1, 256), 1, 100),
                "EnableSageMakerMetricsTimeSeries": boolean,
                "MetricDefinitions": list_of(
                    structure({"Name": string(1, 255), "Regex": all_of(string(1, 500), linear_regex)},
                              required=("Name", "Regex")),
                    0, 40,
                ),  # fmt: skip
            }
        ),
        "Environment": string_map(100, string(1, 512, _ENVIRONMENT_KEY), string(0, 512)),
        "HyperParameters": string_map(100, string(0, 256), string(0, 2500)),
        "StoppingCondition": structure(
            {
                "MaxRuntimeInSeconds": integer(1, MAX_RUNTIME_SECONDS),
                "MaxWaitTimeInSeconds": integer(1, MAX_RUNTIME_SECONDS),
                "MaxPendingTimeInSeconds": integer(7200, 2419200),
            }
        ),
        "OutputDataConfig": structure({"S3OutputPath": S3_URI, "KmsKeyId": string(0, 2048)}),
        "ResourceConfig": structure(
            {
                "InstanceType": string(0, 64),
                "InstanceCount": integer(0, 1024),
                "VolumeSizeInGB": integer(0, 16384),
                "KeepAlivePeriodInSeconds": integer(0, 3600),
            }
        ),
        "InputDataConfig": list_of(structure({"ChannelName": string(1, 64)}, required=("ChannelName",)), 1, 20),
        "DebugHookConfig": structure(
            {
                **DEBUG_HOOK_LOCATIONS,
                "HookParameters": CONFIG_MAP,
                "CollectionConfigurations": list_of(
                    structure(
                        {"CollectionName": string(1, 256), "CollectionParameters": CONFIG_MAP},
                        required=("CollectionName",),
                    ),
                    0,
                    20,
                ),
            }
        ),
        "DebugRuleConfigurations": list_of(_RULE, 0, 20),
        "ProfilerConfig": PROFILER_CONFIG,
        "ProfilerRuleConfigurations": list_of(_RULE, 0, 20),
        "TensorBoardOutputConfig": structure({"S3OutputPath": S3_URI, "LocalPath": DIRECTORY}),
        "Tags": list_of(structure({"Key": string(1, 128), "Value": string(0, 256)}, required=("Key",)), 0, 50),
    },
    required=("TrainingJobName",),
)
_LIST = structure(
    {
        "NameContains": string(0, 63, _NAME_CONTAINS),
        "StatusEquals": enum(*_JOB_STATUSES),
        "SortBy": enum("Name", "CreationTime", "Status"),
        "SortOrder": enum("Ascending", "Descending"),
        "MaxResults": integer(1, 100),
        "NextToken": string(0, 8192, _NEXT_TOKEN),
        "CreationTimeAfter": timestamp,
        "CreationTimeBefore": timestamp,
        "LastModifiedTimeAfter": timestamp,
        "LastModifiedTimeBefore": timestamp,
        "WarmPoolStatusEquals": enum("Available", "Terminated", "Reused", "InUse"),
        "TrainingPlanArnEquals": string(0, 2048),
    }
)
_NAME = structure({"TrainingJobName": string(1, 63, JOB_NAME)}, required=("TrainingJobName",))


def _run(shape: Check, body: Any) -> None:
    errors: list[str] = []
    _unsafe_strings(body, "", errors)
    if not errors:  # a string that cannot be printed would garble the type messages
        shape(body, "", errors)
    if errors:
        count = len(errors)
        shown = "; ".join(errors[:10]) + (f"; and {count - 10} more" if count > 10 else "")
        raise RequestInvalid(f"{count} validation error{'s' if count > 1 else ''} detected: {shown}")


def member_errors(shape: Check, value: Any) -> list[str]:
    """The messages of ``shape`` for one member document (paths relative to it), NUL and surrogates first."""
    errors: list[str] = []
    _unsafe_strings(value, "", errors)
    if not errors:
        shape(value, "", errors)
    return errors


def check_create_request(body: Any) -> None:
    """Raise RequestInvalid unless ``body`` is a well-typed CreateTrainingJob request."""
    _run(_CREATE, body)


def check_list_request(body: Any) -> None:
    _run(_LIST, body)


def check_name_request(body: Any) -> None:
    """DescribeTrainingJob and StopTrainingJob: a valid TrainingJobName."""
    _run(_NAME, body)
