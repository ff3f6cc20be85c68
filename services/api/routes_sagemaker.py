"""SageMaker-compatible endpoint: awsJson 1.1 on ``POST /`` with ``X-Amz-Target: SageMaker.<Op>``.

Point boto3 at it with ``boto3.client("sagemaker", endpoint_url=...)``. Supported operations:
CreateTrainingJob, DescribeTrainingJob, StopTrainingJob, ListTrainingJobs. Errors are HTTP 400
with ``{"__type": <code>, "message": <text>}`` (ValidationException, ResourceNotFound,
ResourceInUse); an unknown operation is ``UnknownOperationException``.

A job belongs to the key that created it; a key sees and stops its own jobs and what the tenancy
policy grants it (trainguard.services.api.policy.TenancyPolicy). Another tenant's job answers
``ResourceNotFound`` exactly as a missing one, and ListTrainingJobs pages through the caller's jobs only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from trainguard.services.api.auth import SigV4Error, sagemaker_precheck, verify_sagemaker_request
from trainguard.services.api.job_metrics import metric_scanner
from trainguard.services.api.jobs import JobExists, JobForbidden, JobNotFound, JobService
from trainguard.services.api.policy import Caller
from trainguard.services.api.routes_logs import LOGS_OPERATIONS, LOGS_TARGET_PREFIX
from trainguard.services.api.sagemaker import SageMakerError, job_spec_from_request
from trainguard.services.api.sagemaker_validation import (
    RequestInvalid,
    check_create_request,
    check_list_request,
    check_name_request,
)

from trainguard.statuses import JOB_TERMINAL

__all__ = ["sagemaker_router"]

CONTENT_TYPE = "application/x-amz-json-1.1"
_SORT_KEYS = {"Name": lambda j: j.name, "CreationTime": lambda j: j.creation_time, "Status": lambda j: j.status}

sagemaker_router = APIRouter(tags=["sagemaker"])


def _answer(body: dict[str, Any], status: int = 200) -> Response:
    return Response(content=json.dumps(body), status_code=status, media_type=CONTENT_TYPE)


def _error(error: SageMakerError) -> Response:
    return _answer({"__type": error.code, "message": error.message}, error.status)


def _checked(check: Any, body: dict[str, Any]) -> None:
    try:
        check(body)
    except RequestInvalid as error:
        raise SageMakerError("ValidationException", str(error)) from None


def _name(body: dict[str, Any]) -> str:
    _checked(check_name_request, body)
    return body["TrainingJobName"]


def _not_found(name: str) -> SageMakerError:
    return SageMakerError("ResourceNotFound", f"Requested resource not found: training job {name} does not exist")


def _create(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    _checked(check_create_request, body)  # types and bounds first: nothing below sees a wrong type
    spec, unavailable, labels = job_spec_from_request(body)
    try:
        description = service.create(
            spec, source="sagemaker", request=body, unavailable_rules=unavailable, owner=caller
        )
    except JobExists:
        raise SageMakerError(
            "ResourceInUse",
            "Training job names must be unique within an AWS account and region, "
            f"and a training job with this name already exists ({spec.name})",
        ) from None
    except ValueError as error:
        raise SageMakerError("ValidationException", _member_message(str(error), labels)) from None
    return {"TrainingJobArn": description["arn"]}


_RULE_FIELDS = {"rule": "RuleParameters.rule_to_invoke", "source_uri": "RuleParameters.source_s3_uri",
                "parameters": "RuleParameters"}  # fmt: skip


def _member_message(message: str, labels: dict[int, str]) -> str:
    """'rules.0.rule: why' from the job service -> 'DebugRuleConfigurations[0].RuleParameters.rule_to_invoke: why'."""
    match = re.match(r"^rules\.(\d+)\.(\w+): ", message)
    if not match:
        return message
    index, field = int(match.group(1)), match.group(2)
    member = f"{labels.get(index, f'DebugRuleConfigurations[{index}]')}.{_RULE_FIELDS.get(field, field)}"
    return f"{member}: {message[match.end():]}"


def _describe(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = _name(body)
    try:
        description = service.describe_sagemaker(name, caller)
    except JobNotFound:
        raise _not_found(name) from None
    definitions = (description.get("AlgorithmSpecification") or {}).get("MetricDefinitions")
    if definitions and "TrainingStartTime" in description:
        when = description.get("TrainingEndTime") or description["LastModifiedTime"]
        # Bounded (RE2, the log's tail, a time budget) and cached per job and log: job_metrics.
        description["FinalMetricDataList"] = metric_scanner(service).final_metric_data(
            name, description.get("CreationTime"), definitions, when,
            finished=description.get("TrainingJobStatus") in JOB_TERMINAL,
            read_log=lambda tail: service.logs(name, "training", tail, caller=caller),
        )  # fmt: skip
    return description


def _stop(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = _name(body)
    try:
        if not service.stop(name, cause="StopTrainingJob", caller=caller):
            status = service.job_for(caller, name, "stop").status
            if status in JOB_TERMINAL:  # as AWS: stopping an ended job is refused; a Stopping one is a no-op
                raise SageMakerError(
                    "ValidationException", f"The request was rejected because the training job is in status {status}."
                )
    except JobNotFound:
        raise _not_found(name) from None
    except JobForbidden:
        raise SageMakerError(
            "AccessDeniedException", f"{caller.name} is not authorized to perform: sagemaker:StopTrainingJob on "
            f"training job {name} (the tenancy policy grants it read only)",
        ) from None
    return {}


def _list(service: JobService, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
    _checked(check_list_request, body)
    jobs = service.list_jobs(status=body.get("StatusEquals"), name_contains=body.get("NameContains"), caller=caller)
    for key, attribute, before in (
        ("CreationTimeAfter", "creation_time", False),
        ("CreationTimeBefore", "creation_time", True),
        ("LastModifiedTimeAfter", "last_modified_time", False),
        ("LastModifiedTimeBefore", "last_modified_time", True),
    ):
        if body.get(key) is not None:
            limit = float(body[key])
            jobs = [j for j in jobs if (getattr(j, attribute) < limit if before else getattr(j, attribute) > limit)]
    sort_by = body.get("SortBy") or "CreationTime"
    jobs.sort(key=_SORT_KEYS[sort_by], reverse=(body.get("SortOrder") or "Descending") == "Descending")
    max_results = body.get("MaxResults") or 10
    start = int(body.get("NextToken") or 0)  # checked: 1-9 decimal digits, as this server hands them out
    page = jobs[start : start + max_results]
    answer: dict[str, Any] = {"TrainingJobSummaries": service.summaries(page)}
    if start + max_results < len(jobs):
        answer["NextToken"] = str(start + max_results)
    return answer


_OPERATIONS = {
    "CreateTrainingJob": _create,
    "DescribeTrainingJob": _describe,
    "StopTrainingJob": _stop,
    "ListTrainingJobs": _list,
}


@sagemaker_router.post("/", summary="SageMaker API (awsJson 1.1, X-Amz-Target: SageMaker.<Operation>)")
async def sagemaker_endpoint(request: Request) -> Response:
    target = request.headers.get("x-amz-target", "")
    prefix, _, operation = target.partition(".")
    # The same endpoint answers the CloudWatch Logs calls of fit(logs=True) (routes_logs).
    operations = {"SageMaker": _OPERATIONS, LOGS_TARGET_PREFIX: LOGS_OPERATIONS}.get(prefix)
    if operations is None or not operation:
        return _error(
            SageMakerError("UnknownOperationException", f"X-Amz-Target {target!r}: expected SageMaker.<Operation>")
        )
    try:  # key, scope, date and signed headers before the body is read; the signature needs the body
        sagemaker_precheck(request)
    except SigV4Error as error:
        return _error(SageMakerError(error.code, error.message, 403))
    handler = operations.get(operation)
    if handler is None:
        return _error(
            SageMakerError(
                "UnknownOperationException",
                f"trainguard does not implement {prefix}.{operation}; supported: {', '.join(operations)}",
            )
        )
    raw = await request.body()
    try:
        caller = verify_sagemaker_request(request, raw)
    except SigV4Error as error:
        return _error(SageMakerError(error.code, error.message, 403))
    try:
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
    except RecursionError:
        return _error(SageMakerError("SerializationException", "request body: nested too deeply"))
    except ValueError as error:
        return _error(SageMakerError("SerializationException", f"request body: {error}"))
    service: JobService = request.app.state.service
    try:
        # The handlers touch the database and the launcher: keep them off the event loop.
        from starlette.concurrency import run_in_threadpool

        return _answer(await run_in_threadpool(handler, service, body, caller))
    except SageMakerError as error:
        return _error(error)
