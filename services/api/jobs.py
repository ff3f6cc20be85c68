"""The job service: creates jobs, records what rule runners report, evaluates alarms, runs actions.

Every state change goes through here and into the database, so the API process itself holds no
state a restart could lose. The reconciler (trainguard.services.api.reconciler) drives the lifecycle from
what the launcher reports; this module owns the transitions.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeAlias

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, load_only, sessionmaker
from trainguard.services.api.db import (
    ActionRow,
    AlarmRow,
    ComponentRow,
    JobRow,
    ReportSequenceRow,
    RuleRow,
    TransitionRow,
)
from trainguard.services.api.job_actions import JobActions
from trainguard.services.api.job_creation import GroupCommit, NameClaims, NameTaken, check_launchable, new_job_rows
from trainguard.services.api.job_launch_queue import JobLaunching, JobLaunchQueue
from trainguard.services.api.planner import plan_job
from trainguard.services.api.policy import OPERATOR, OPERATOR_CALLER, Caller
from trainguard.services.api.schemas import JobSpec
from trainguard.services.api.settings import Settings
from trainguard.services.api.views import native_description, sagemaker_description, sagemaker_summary
from trainguard.services.errors import ServiceError
from trainguard.services.launchers.base import Launcher, launcher_support

from trainguard.statuses import RULE_TERMINAL, JobStatus, RuleStatus

__all__ = ["JobExists", "JobForbidden", "JobNotFound", "JobService"]

log = logging.getLogger("trainguard.api")

# What job lists and summaries read of a job (native list, ListTrainingJobs, the stop-all path).
_SUMMARY_COLUMNS = (
    JobRow.name, JobRow.arn, JobRow.status, JobRow.secondary_status, JobRow.creation_time,
    JobRow.last_modified_time, JobRow.training_end_time, JobRow.owner,
)  # fmt: skip

MAX_FINDINGS = 50
# The rows that belong to one job (their job_name column): what _rows reads.
_JobChild: TypeAlias = TransitionRow | ComponentRow | RuleRow | AlarmRow | ActionRow


class JobNotFound(ServiceError, KeyError):
    pass


class JobExists(ServiceError, ValueError):
    pass


class JobForbidden(ServiceError, PermissionError):
    """The caller may see the job (the policy grants it) but not do this to it (stop)."""


def _json_safe(value: Any) -> Any:
    """Non-finite floats as JSON text ("NaN", "Infinity"): strict JSON answers and Postgres JSONB take no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


class JobService(JobLaunching):
    def __init__(self, sessions: sessionmaker, launcher: Launcher, settings: Settings) -> None:
        self.sessions = sessions
        self.launcher = launcher
        self.settings = settings
        self.lock = threading.RLock()
        # Creations claim their names in memory and commit their rows together (group commit).
        self._name_claims = NameClaims(sessions)
        self._group_commit = GroupCommit(sessions)
        self.actions = JobActions(self)  # alarms, their actions and state-change events
        self.starting: set[str] = set()  # jobs whose components the launcher is starting right now
        self.launch_queue = JobLaunchQueue(
            workers=2,
            settle_seconds=settings.launch_settle_seconds,
            max_delay_seconds=settings.launch_max_delay_seconds,
        )

    def close(self) -> None:
        self.actions.close()
        self.launch_queue.close()

    # -- creation ---------------------------------------------------------------------------------
    def create(
        self,
        spec: JobSpec,
        *,
        source: str = "native",
        request: dict[str, Any] | None = None,
        unavailable_rules: Sequence[dict[str, str]] = (),
        owner: Caller = OPERATOR_CALLER,
    ) -> dict[str, Any]:
        """Record and start a job owned by ``owner``. Raises JobExists, ValueError (bad spec for this launcher).

        One transaction: everything that can refuse the job (policy, planning) runs before its rows
        are committed, and a launch that fails on the request's content deletes them again, so a
        refused job leaves no row behind and its name stays free.
        """
        self._check_policy(spec)
        token = secrets.token_urlsafe(24)
        now = time.time()
        # A name is claimed before its directory is planned; nothing here waits for other
        # creations but the commit, which concurrent creations share. The launch itself runs
        # outside, in the background launch queue.
        try:
            with self._name_claims.claim(spec.name):
                launch = plan_job(spec, self.settings, self.launcher.name, token)
                job_row, children = new_job_rows(
                    spec, launch, self.settings, self.launcher.name, source=source, request=request,
                    unavailable_rules=unavailable_rules, runner_token=token, now=now,
                )  # fmt: skip
                job_row.owner = owner.name
                try:
                    self._group_commit.commit(job_row, children)
                except IntegrityError:
                    with self.sessions() as session:
                        if session.get(JobRow, spec.name) is not None:  # another API process took it
                            raise NameTaken(spec.name) from None
                    raise
        except NameTaken:
            raise JobExists(spec.name) from None
        # Accepted: the launch (fork/exec, container start) runs in the background launch queue, as
        # SageMaker answers CreateTrainingJob before the instances start. Its failure ends the job
        # Failed with the reason; until then the reconciler leaves the job alone (self.starting).
        self._queue_launch(spec.name, launch)
        # Described from the rows just written, not read back (6 queries less).
        by_kind: dict[type, list[Any]] = {TransitionRow: [], ComponentRow: [], RuleRow: [], AlarmRow: []}
        for row in children:
            by_kind[type(row)].append(row)
        return native_description(
            job_row,
            by_kind[TransitionRow],
            sorted(by_kind[ComponentRow], key=lambda row: row.role),
            sorted(by_kind[RuleRow], key=lambda row: row.configuration_name),
            sorted(by_kind[AlarmRow], key=lambda row: row.name),
            [],
        )

    def _check_policy(self, spec: JobSpec) -> None:
        """What the server's policy forbids (trainguard.services.api.policy), as ValueError 'field: why'."""
        from trainguard.services.api.planner import job_dir
        from trainguard.services.api.policy import PolicyError, SourcePolicy
        from trainguard.services.api.schemas import check_rule_class

        policy = SourcePolicy.from_settings(self.settings)
        for index, rule in enumerate(spec.rules):
            try:
                if rule.source_uri:
                    policy.check_source_uri(rule.source_uri)
                else:
                    policy.check_rule_reference(rule.rule)
                    if ":" in rule.rule:
                        check_rule_class(rule)  # imported only now that the policy allowed its module
            except PolicyError as error:
                field = "source_uri" if rule.source_uri else "rule"
                raise ValueError(f"rules.{index}.{field}: {error}") from None
            except ValueError as error:
                raise ValueError(f"rules.{index}.{error}") from None
        check_launchable(spec, self.launcher)  # instances, container paths (job_creation)
        if spec.working_dir and not launcher_support(self.launcher).container_paths:
            try:
                policy.check_working_dir(spec.working_dir, job_dir(self.settings, spec.name))
            except PolicyError as error:
                raise ValueError(f"working_dir: {error}") from None

    # -- reading ----------------------------------------------------------------------------------
    # Every read or stop on behalf of a caller goes through job_for: a job the caller may not see
    # is JobNotFound, exactly as a job that does not exist, so other tenants' names do not leak.
    # The service's own work (reconciler, actions of the operator's jobs) acts as the operator.
    def _job(self, session: Session, name: str, caller: Caller = OPERATOR_CALLER, action: str = "read") -> JobRow:
        job = session.get(JobRow, name)
        tenancy = self.settings.tenancy
        if job is None or not tenancy.allows(caller, "read", job.owner):
            raise JobNotFound(name)
        if action != "read" and not tenancy.allows(caller, action, job.owner):
            raise JobForbidden(f"{caller.name} may see training job {name} but not {action} it")
        return job

    def job_for(self, caller: Caller, name: str, action: str = "read") -> JobRow:
        """The job ``name`` if ``caller`` may ``action`` it ("read" or "stop").

        JobNotFound when there is no such job or the caller may not see it (the same answer, so
        names do not leak); JobForbidden when it may see the job but not ``action`` it.
        """
        with self.sessions() as session:
            return self._job(session, name, caller, action)

    def _rows(self, session: Session, model: type[_JobChild], name: str, order: Any) -> list[Any]:
        return list(session.scalars(select(model).where(model.job_name == name).order_by(order)))

    def describe(self, name: str, caller: Caller = OPERATOR_CALLER) -> dict[str, Any]:
        with self.sessions() as session:
            job = self._job(session, name, caller)
            return native_description(
                job,
                self._rows(session, TransitionRow, name, TransitionRow.id),
                self._rows(session, ComponentRow, name, ComponentRow.role),
                self._rows(session, RuleRow, name, RuleRow.configuration_name),
                self._rows(session, AlarmRow, name, AlarmRow.name),
                self._rows(session, ActionRow, name, ActionRow.id),
            )

    def describe_sagemaker(self, name: str, caller: Caller = OPERATOR_CALLER) -> dict[str, Any]:
        with self.sessions() as session:
            job = self._job(session, name, caller)
            return sagemaker_description(
                job,
                self._rows(session, TransitionRow, name, TransitionRow.id),
                self._rows(session, RuleRow, name, RuleRow.configuration_name),
                self.settings.service_image,
            )

    def logs(self, name: str, component: str, tail: int | None = None, *, caller: Caller = OPERATOR_CALLER) -> str:
        """A component's log, if ``caller`` may read the job (JobNotFound otherwise)."""
        self.job_for(caller, name)
        return self.launcher.logs(name, component, tail)

    def list_jobs(
        self,
        *,
        status: str | None = None,
        name_contains: str | None = None,
        caller: Caller = OPERATOR_CALLER,
        action: str = "read",
    ) -> list[JobRow]:
        """Jobs ``caller`` may ``action``, newest first, with the columns a summary shows loaded (not each
        job's spec, request and environment, which would cost a long list most of its CPU)."""
        owners = self.settings.tenancy.owners(caller, action)
        with self.sessions() as session:
            query = select(JobRow).options(load_only(*_SUMMARY_COLUMNS)).order_by(JobRow.creation_time.desc())
            if status:
                query = query.where(JobRow.status == status)
            if owners is not None:  # filtered in the query: pages are cut from the caller's jobs only
                query = query.where(JobRow.owner.in_(sorted(owners)))
            jobs = list(session.scalars(query))
        # In Python: case-sensitive on every database (SQLite's LIKE ignores case)
        return [job for job in jobs if name_contains in job.name] if name_contains else jobs

    def summaries(self, jobs: list[JobRow]) -> list[dict[str, Any]]:
        return [sagemaker_summary(job) for job in jobs]

    def runner_token(self, name: str) -> str:
        """The job's runner token; "" (no token passes) once the key that created the job is revoked:
        a job holds no more than its owner does."""
        with self.sessions() as session:
            job = self._job(session, name)
            if job.owner != OPERATOR and not self.settings.sagemaker_keys.has_name(job.owner):
                return ""
            return job.runner_token

    # -- transitions ------------------------------------------------------------------------------
    def _transition(self, session: Session, job: JobRow, secondary: str, message: str = "") -> None:
        if job.secondary_status == secondary:
            return
        now = time.time()
        last = session.scalars(
            select(TransitionRow).where(TransitionRow.job_name == job.name).order_by(TransitionRow.id.desc())
        ).first()
        if last is not None and last.end_time is None:
            last.end_time = now
        session.add(TransitionRow(job_name=job.name, status=secondary, start_time=now, message=message))
        job.secondary_status = secondary
        job.last_modified_time = now
        self.actions.changed.add(job.name)

    def _finish(self, session: Session, job: JobRow, status: str, secondary: str, reason: str = "") -> None:
        self._transition(session, job, secondary, reason)
        now = time.time()
        last = session.scalars(
            select(TransitionRow).where(TransitionRow.job_name == job.name).order_by(TransitionRow.id.desc())
        ).first()
        if last is not None and last.end_time is None:
            last.end_time = max(now, last.start_time)
        job.status = status
        if status == JobStatus.FAILED:
            job.failure_reason = reason
        if job.training_end_time is None:
            job.training_end_time = now
        job.last_modified_time = now
        self.actions.changed.add(job.name)

    def set_rule_status(self, session: Session, job: JobRow, rule: RuleRow, status: str, details: str = "") -> None:
        if rule.status == status and (not details or rule.status_details == details):
            return
        rule.status = status
        rule.status_details = details
        rule.last_modified_time = time.time()
        job.last_modified_time = rule.last_modified_time
        self.actions.changed.add(job.name)

    # -- stopping ---------------------------------------------------------------------------------
    def stop(
        self,
        name: str,
        grace_seconds: float | None = None,
        cause: str = "StopTrainingJob",
        status: str = JobStatus.STOPPED.value,
        *,
        caller: Caller = OPERATOR_CALLER,
    ) -> bool:
        """Ask the job to stop: Stopping now, Stopped when its training process is gone.

        Returns False when the job is not InProgress (already stopping or ended). JobNotFound when
        there is no such job or ``caller`` may not stop it.
        """
        grace = self.settings.stop_grace_seconds if grace_seconds is None else grace_seconds
        with self.lock, self.sessions() as session:
            job = self._job(session, name, caller, "stop")
            if job.status != JobStatus.IN_PROGRESS:
                return False
            job.status = JobStatus.STOPPING.value
            job.stop_requested_at = time.time()
            job.stop_status = status
            job.stop_cause = cause
            self._transition(session, job, JobStatus.STOPPING.value, cause)
            for rule in self._rows(session, RuleRow, name, RuleRow.configuration_name):
                if rule.status == RuleStatus.IN_PROGRESS:
                    self.set_rule_status(session, job, rule, RuleStatus.STOPPING.value)
            session.commit()
        # Docker's stop blocks for the grace period: never on the request thread.
        threading.Thread(target=self._stop_after_launch, args=(name, grace), daemon=True).start()
        self.flush_notifications()
        return True

    def _stop_after_launch(self, name: str, grace: float) -> None:
        """The launcher's stop, once the job's launch (if still queued or running) has ended.

        A stop that reached the launcher before the launch queue started the job would find
        nothing to stop, and the processes started after it would run on with the job Stopping.
        """
        while name in self.starting:
            time.sleep(0.05)
        self._launcher_stop(name, None, grace)

    def _launcher_stop(self, name: str, roles: tuple[str, ...] | None, grace: float) -> None:
        try:
            self.launcher.stop(name, roles, grace)
        except Exception as error:  # noqa: BLE001 - logged; the reconciler retries on the next tick
            log.warning("stopping %s %s failed: %s", name, roles or "(all)", error)

    # -- rule runner reports ----------------------------------------------------------------------
    def report_rule_status(self, name: str, configuration: str, update: dict[str, Any]) -> dict[str, Any]:
        """Apply one StatusUpdate.to_dict() from a rule runner."""
        status = str(update.get("status") or "")
        sequence, outbox = update.get("sequence"), update.get("outbox")
        # A runner's durable outbox re-sends a report whose answer it lost (an API restart): the last
        # sequence applied is stored with the report's effects, so applying it twice is impossible.
        replay_key = (
            (name, configuration, outbox)
            if isinstance(outbox, str) and 0 < len(outbox) <= 64 and isinstance(sequence, int)
            else None
        )
        with self.lock, self.sessions() as session:
            job = self._job(session, name)
            rule = session.get(RuleRow, (name, configuration))
            if rule is None:
                raise JobNotFound(f"{name}/{configuration}")
            applied_before = session.get(ReportSequenceRow, replay_key) if replay_key is not None else None
            if applied_before is not None and sequence <= applied_before.sequence:
                return {"accepted": True, "applied": False, "reason": f"report {sequence} was already applied"}
            if update.get("last_evaluated_step") is not None:
                rule.last_evaluated_step = max(int(update["last_evaluated_step"]), rule.last_evaluated_step or -1)
            result = _json_safe(update.get("result")) or None
            if result:
                if result.get("fired"):
                    rule.findings = [*(rule.findings or []), result][-MAX_FINDINGS:]
                if result.get("missing"):
                    known = {(m.get("what"), m.get("collection")) for m in rule.missing or []}
                    fresh = [m for m in result["missing"] if (m.get("what"), m.get("collection")) not in known]
                    rule.missing = [*(rule.missing or []), *fresh]
                elif result.get("step") is not None and "datapoints" not in update:
                    self.add_datapoint(
                        session,
                        job,
                        configuration,
                        "RuleIssuesFound",
                        1.0 if result.get("fired") and not result.get("advice") else 0.0,  # advice raises no alarm
                        result.get("step"),
                    )
            for point in update.get("datapoints") or []:
                self.add_datapoint(
                    session,
                    job,
                    configuration,
                    str(point.get("metric") or "RuleIssuesFound"),
                    float(point["value"]),
                    point.get("step"),
                )
            applied = True
            if not status:
                pass  # datapoints only
            elif rule.status in RULE_TERMINAL and status != rule.status:
                applied = False  # a final status is final: a late or duplicate report never replaces it
            elif rule.status in (RuleStatus.STOPPING, RuleStatus.STOPPED) and status in (
                RuleStatus.IN_PROGRESS,
                RuleStatus.NO_ISSUES_FOUND,
                RuleStatus.STOPPED,
                RuleStatus.STOPPING,
            ):
                pass  # a stop is under way: the runner's own end is reported as Stopped by the reconciler
            else:
                self.set_rule_status(session, job, rule, status, str(update.get("status_details") or ""))
            if (
                status == RuleStatus.ISSUES_FOUND
                and not (result and result.get("fired"))
                and "datapoints" not in update
            ):
                self.add_datapoint(session, job, configuration, "RuleIssuesFound", 1.0, update.get("step"))
            if applied_before is not None:
                applied_before.sequence = sequence
            elif replay_key is not None:
                session.add(ReportSequenceRow(job_name=name, configuration_name=configuration, outbox=outbox,
                                              sequence=sequence))  # fmt: skip
            session.commit()
        self.flush_notifications()
        if not applied:
            return {"accepted": True, "applied": False, "status": rule.status,
                    "reason": f"the rule already ended {rule.status}; a final status is not replaced"}  # fmt: skip
        return {"accepted": True}

    # -- metrics, alarms, actions (job_actions.py) --------------------------------------------------
    def add_datapoint(
        self, session: Session, job: JobRow, configuration: str, metric: str, value: float, step: Any
    ) -> None:
        self.actions.add_datapoint(session, job, configuration, metric, value, step)

    def flush_notifications(self) -> None:
        """Run actions scheduled by committed alarm transitions; emit state-change events."""
        self.actions.flush()

    def resume_actions(self) -> None:
        """After a restart: run actions still Pending; one that was Running when the API died is Failed."""
        self.actions.resume()
