"""A CloudWatch-Logs-compatible read side for training jobs' logs (what ``fit(logs=True)`` calls).

The SageMaker SDK streams a job's log with ``DescribeLogStreams`` (log group
``/aws/sagemaker/TrainingJobs``, stream prefix ``<job>/``) and ``GetLogEvents`` (``startTime``,
``startFromHead``, ``nextToken``), through a ``logs`` client a user points here with
``AWS_ENDPOINT_URL_LOGS``. Requests arrive on the SageMaker endpoint (awsJson 1.1,
``X-Amz-Target: Logs_20140328.<Operation>``) and are SigV4-checked like SageMaker's.

One stream per job (``<job>/algo-1-<start epoch>``), read from the launcher's log of the training
component. The launchers keep no per-line times, so line ``i`` gets the timestamp ``training start
(ms) + i``: stable across calls and strictly increasing, which is what the SDK's position tracking
(last timestamp + events to skip) needs; the times are ordinal, not wall-clock.

A caller reads the logs of the jobs it may describe (the tenancy policy); another tenant's job has
no stream, as a job that does not exist.
"""

from __future__ import annotations

import re
from typing import Any

from trainguard.services.api.jobs import JobNotFound, JobService
from trainguard.services.api.policy import Caller
from trainguard.services.api.sagemaker import SageMakerError
from trainguard.services.api.sagemaker_validation import JOB_NAME, unsafe_text

__all__ = ["LOG_GROUP", "LOGS_OPERATIONS", "LOGS_TARGET_PREFIX"]

LOGS_TARGET_PREFIX = "Logs_20140328"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_PAGE_EVENTS = 10_000  # CloudWatch's own page limit
_PAGE_BYTES = 1_048_576
_MAX_NAME = 512  # CloudWatch's limit on log group and stream names


def _optional_string(body: dict[str, Any], member: str) -> str | None:
    return None if body.get(member) is None else _string(body, member)


def _string(body: dict[str, Any], member: str) -> str:
    value = body.get(member)
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME:
        raise SageMakerError("InvalidParameterException", f"{member} must be a string of 1 to {_MAX_NAME} characters")
    problem = unsafe_text(value)
    if problem:
        raise SageMakerError("InvalidParameterException", f"{member} must {problem}")
    return value


def _integer(body: dict[str, Any], member: str, low: int, high: int) -> int | None:
    value = body.get(member)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SageMakerError("InvalidParameterException", f"{member} must be an integer from {low} to {high}")
    return value


def _check_group(body: dict[str, Any]) -> None:
    group = _string(body, "logGroupName")
    if group != LOG_GROUP:
        raise SageMakerError("ResourceNotFoundException", f"The specified log group does not exist: {group} "
                             f"(trainguard serves {LOG_GROUP})")  # fmt: skip


def _job_start_ms(service: JobService, job_name: str, caller: Caller) -> tuple[int, dict[str, Any]] | None:
    if not JOB_NAME.match(job_name):
        return None  # no job has such a name: no stream
    try:
        description = service.describe_sagemaker(job_name, caller)
    except JobNotFound:
        return None
    start = description.get("TrainingStartTime") or description.get("CreationTime")
    if start is None:
        return None  # every described job has a CreationTime: nothing to anchor a stream on otherwise
    return int(float(start) * 1000), description


def _stream_name(job_name: str, start_ms: int) -> str:
    return f"{job_name}/algo-1-{start_ms // 1000}"


def _log_lines(service: JobService, job_name: str, caller: Caller) -> list[str]:
    try:
        text = service.logs(job_name, "training", caller=caller)
    except Exception:  # noqa: BLE001 - a job whose components are gone has no log left
        return []
    return text.splitlines()


def describe_log_streams(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    _check_group(body)
    prefix = _optional_string(body, "logStreamNamePrefix") or ""
    _integer(body, "limit", 1, 50)
    job_name = prefix.split("/", 1)[0]
    found = _job_start_ms(service, job_name, caller) if job_name else None
    if found is None:
        return {"logStreams": []}
    start_ms, description = found
    if "TrainingStartTime" not in description:
        return {"logStreams": []}  # SageMaker creates the stream when the container starts
    name = _stream_name(job_name, start_ms)
    if not name.startswith(prefix):
        return {"logStreams": []}
    count = len(_log_lines(service, job_name, caller))
    last = start_ms + max(count - 1, 0)
    return {
        "logStreams": [
            {
                "logStreamName": name,
                "creationTime": start_ms,
                "firstEventTimestamp": start_ms,
                "lastEventTimestamp": last,
                "lastIngestionTime": last,
                "uploadSequenceToken": "0",
                "arn": f"arn:aws:logs:us-east-1:000000000000:log-group:{LOG_GROUP}:log-stream:{name}",
                "storedBytes": 0,
            }
        ]
    }


def get_log_events(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    _check_group(body)
    stream = _string(body, "logStreamName")
    job_name = stream.split("/", 1)[0]
    found = _job_start_ms(service, job_name, caller)
    if found is None or _stream_name(job_name, found[0]) != stream:
        raise SageMakerError("ResourceNotFoundException", f"The specified log stream does not exist: {stream}")
    start_ms = found[0]
    limit = _integer(body, "limit", 1, _PAGE_EVENTS) or _PAGE_EVENTS
    start_time = _integer(body, "startTime", 0, 2**53) or 0
    token = body.get("nextToken")
    lines = _log_lines(service, job_name, caller)
    if token is not None:
        # ASCII digits, as this server hands them out ('²' is a digit to isdigit, not to int)
        if not isinstance(token, str) or not re.fullmatch(r"f/[0-9]{1,15}", token):
            raise SageMakerError("InvalidParameterException", "nextToken is not a token this server handed out")
        first = int(token[2:])
    else:
        first = max(0, start_time - start_ms)
    first = min(first, len(lines))
    events: list[dict[str, Any]] = []
    size = 0
    index = first
    while index < len(lines) and len(events) < limit and size < _PAGE_BYTES:
        timestamp = start_ms + index
        events.append({"timestamp": timestamp, "message": lines[index], "ingestionTime": timestamp})
        size += len(lines[index]) + 26  # CloudWatch counts 26 bytes of overhead per event
        index += 1
    return {"events": events, "nextForwardToken": f"f/{index}", "nextBackwardToken": f"b/{first}"}


LOGS_OPERATIONS = {"DescribeLogStreams": describe_log_streams, "GetLogEvents": get_log_events}
