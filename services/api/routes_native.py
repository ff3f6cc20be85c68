"""Native REST API (documented at /docs and /openapi.json).

Callers: the operator's bearer token (every job) or an access key's SigV4 signature (its own jobs
and what the tenancy policy grants it); a job the caller may not see is a 404 like a missing one.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from trainguard.services.api.auth import check_bearer, native_caller
from trainguard.services.api.jobs import JobExists, JobForbidden, JobNotFound, JobService
from trainguard.services.api.policy import Caller
from trainguard.services.api.rule_reports import RuleStatusReport
from trainguard.services.api.schemas import JOB_NAME_PATTERN, MAX_GRACE_SECONDS, JobSpec

__all__ = ["native_router"]


def _service(request: Request) -> JobService:
    return request.app.state.service


def _not_found(name: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no training job named {name!r}")


def _job_name(name: str) -> str:
    """A name no job can have is a 404 at once (it never reaches the database: NUL, 10 kB, ...)."""
    if not re.fullmatch(JOB_NAME_PATTERN.strip("^$"), name):
        raise _not_found(name[:80])
    return name


# Who is asking: the operator (API token) or an access key (SigV4); computed once per request.
CallerOf = Annotated[Caller, Depends(native_caller)]

native_router = APIRouter(prefix="/v1")
# On the router too: no route under /v1/jobs can be added without a verified caller (computed once per request).
jobs_router = APIRouter(prefix="/jobs", tags=["jobs"], dependencies=[Depends(native_caller)])


@jobs_router.post("", status_code=201, summary="Create and start a training job (owned by the caller)")
def create_job(spec: JobSpec, request: Request, caller: CallerOf) -> Any:
    service = _service(request)
    try:
        return service.create(spec, owner=caller)
    except JobExists:
        raise HTTPException(status_code=409, detail=f"a training job named {spec.name!r} already exists") from None
    except ValueError as error:
        field, _, message = str(error).partition(": ")
        if field.split(".")[0] not in JobSpec.model_fields:  # not 'field.path: why': the whole request
            field, message = "", str(error)
        location = ["body", *(int(p) if p.isdigit() else p for p in field.split(".") if p)]
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": location, "msg": message or str(error), "type": "value_error"}]},
        )


@jobs_router.get("", summary="List the training jobs the caller may see, newest first")
def list_jobs(
    request: Request,
    caller: CallerOf,
    status: Literal["InProgress", "Completed", "Failed", "Stopping", "Stopped"] | None = Query(None),
    name_contains: str | None = Query(None, max_length=63, pattern=r"^[A-Za-z0-9\-]*$"),
) -> dict[str, Any]:
    service = _service(request)
    jobs = service.list_jobs(status=status, name_contains=name_contains, caller=caller)
    return {
        "jobs": [
            {
                "name": job.name,
                "owner": job.owner,
                "status": job.status,
                "secondary_status": job.secondary_status,
                "creation_time": job.creation_time,
                "last_modified_time": job.last_modified_time,
                "training_end_time": job.training_end_time,
            }
            for job in jobs
        ]
    }


@jobs_router.get("/{name}", summary="Describe a job: status, transitions, rule statuses with findings and fix hints")
def describe_job(name: str, request: Request, caller: CallerOf) -> dict[str, Any]:
    try:
        return _service(request).describe(_job_name(name), caller)
    except JobNotFound:
        raise _not_found(name) from None


@jobs_router.post("/{name}/stop", status_code=202, summary="Stop a job: SIGTERM, grace period, then SIGKILL")
def stop_job(
    name: str,
    request: Request,
    caller: CallerOf,
    grace_seconds: float | None = Query(
        None, ge=0, le=MAX_GRACE_SECONDS, allow_inf_nan=False, description="default TRAINGUARD_STOP_GRACE_SECONDS (120)"
    ),
) -> dict[str, Any]:
    service = _service(request)
    try:
        stopping = service.stop(_job_name(name), grace_seconds, cause="stopped by request", caller=caller)
        return {"name": name, "stopping": stopping, "status": service.job_for(caller, name).status}
    except JobNotFound:
        raise _not_found(name) from None
    except JobForbidden as error:
        raise HTTPException(status_code=403, detail=f"{error} (the tenancy policy grants read only)") from None


@jobs_router.get("/{name}/logs", response_class=PlainTextResponse, summary="A component's stdout/stderr")
def job_logs(
    name: str,
    request: Request,
    caller: CallerOf,
    component: str = Query("training", description="training, uploader or rule:<RuleConfigurationName>"),
    tail: int | None = Query(None, ge=0, le=1_000_000),
) -> str:
    service = _service(request)
    try:
        description = service.describe(_job_name(name), caller)
        roles = [c["role"] for c in description["components"]]
        if component not in roles:
            raise HTTPException(
                status_code=404, detail=f"job {name} has no component {component!r}; components: {', '.join(roles)}"
            )
        return service.logs(name, component, tail, caller=caller)
    except JobNotFound:
        raise _not_found(name) from None


internal_router = APIRouter(prefix="/internal", tags=["internal"])


@internal_router.post(
    "/jobs/{name}/rules/{configuration}/status",
    summary="Rule runners report status transitions and findings (API token or the job's runner token)",
)
def report_rule_status(name: str, configuration: str, request: Request, update: RuleStatusReport) -> Any:
    service = _service(request)
    try:
        token = service.runner_token(_job_name(name))
    except JobNotFound:
        check_bearer(request, request.app.state.settings)
        raise _not_found(name) from None
    check_bearer(request, request.app.state.settings, token)
    if len(configuration) > 256 or "\x00" in configuration:
        raise HTTPException(status_code=404, detail=f"job {name} has no such rule configuration")
    try:
        return service.report_rule_status(name, configuration, update.model_dump(exclude_unset=True))
    except JobNotFound:
        raise HTTPException(status_code=404, detail=f"job {name} has no rule configuration {configuration!r}") from None


native_router.include_router(jobs_router)
native_router.include_router(internal_router)
