"""Alarms and their actions for the job service: datapoints move alarms, alarms record actions,
actions run in the background with their outcome recorded, and job state changes go out as events.

An action is recorded (an ``ActionRow``, Pending) in the same transaction as the alarm state that
asked for it, so a crash cannot lose it; :meth:`JobActions.flush` hands the recorded ones to the
dispatcher after the commit, and :meth:`JobActions.resume` picks them up again after a restart.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from trainguard.services.actions import ActionContext, build_event, get_handler
from trainguard.services.actions.dispatch import ActionDispatcher
from trainguard.services.actions.outbound_policy import OutboundPolicy
from trainguard.services.actions.stop_policy import finding_at, is_stop_action, restop_actions
from trainguard.services.alarms import AlarmSpec, AlarmState, breaches, evaluate_alarm
from trainguard.services.api.db import ActionRow, AlarmRow, JobRow, MetricRow, RuleRow
from trainguard.services.api.policy import OPERATOR_CALLER, Caller
from trainguard.services.api.settings import Settings

from trainguard.statuses import JobStatus

__all__ = ["JobActions"]

log = logging.getLogger("trainguard.api")


class _Jobs(Protocol):
    """What the actions need of the job service: its database, and to read and stop jobs."""

    sessions: sessionmaker
    settings: Settings
    lock: threading.RLock

    def job_for(self, caller: Caller, name: str, action: str = "read") -> JobRow: ...

    def list_jobs(
        self, *, status: str | None = None, name_contains: str | None = None, caller: Caller = ...,
        action: str = "read",
    ) -> list[JobRow]: ...  # fmt: skip

    def stop(
        self, name: str, grace_seconds: float | None = None, cause: str = ..., status: str = ..., *,
        caller: Caller = ...,
    ) -> bool: ...  # fmt: skip

    def describe_sagemaker(self, name: str, caller: Caller = ...) -> dict[str, Any]: ...


class JobActions:
    def __init__(self, jobs: _Jobs) -> None:
        self._jobs = jobs
        self.settings = jobs.settings
        # Stop actions run on their own path, never queued behind notifications (actions/dispatch.py).
        self._dispatcher = ActionDispatcher()
        self._outbound = OutboundPolicy.from_settings(jobs.settings)  # where webhooks may connect
        self._submitted: set[int] = set()  # Pending action runs handed to the dispatcher by this process
        self.changed: set[str] = set()  # jobs whose state changed since the last flush (events to send)

    def close(self) -> None:
        self._dispatcher.close()

    def add_datapoint(
        self, session: Session, job: JobRow, configuration: str, metric: str, value: float, step: Any
    ) -> None:
        session.add(
            MetricRow(
                job_name=job.name, configuration_name=configuration, metric_name=metric, value=value,
                step=int(step) if step is not None else None, timestamp=time.time(),
            )
        )  # fmt: skip
        session.flush()
        for alarm in session.scalars(select(AlarmRow).where(AlarmRow.job_name == job.name).order_by(AlarmRow.name)):
            spec = AlarmSpec.from_dict(alarm.spec)
            if spec.metric_name != metric or (spec.rule is not None and spec.rule != configuration):
                continue
            query = (
                select(MetricRow.value)
                .where(MetricRow.job_name == job.name, MetricRow.metric_name == metric)
                .order_by(MetricRow.id.desc())
                .limit(spec.evaluation_periods)
            )
            if spec.rule is not None:
                query = query.where(MetricRow.configuration_name == spec.rule)
            values = list(reversed(list(session.scalars(query))))
            state, reason = evaluate_alarm(spec, values)
            if state.value == alarm.state:
                if state is AlarmState.ALARM and breaches(spec, value):
                    self._stop_for_new_finding(session, job, alarm.name, spec, configuration, step)
                continue
            alarm.state, alarm.state_reason, alarm.updated = state.value, reason, time.time()
            if state is AlarmState.ALARM and spec.actions:
                rule = session.get(RuleRow, (job.name, configuration))
                finding = finding_at(rule.findings, step) if rule is not None else None
                extra = {"alarm": alarm.name, "rule": configuration, "reason": reason, "finding": finding}
                # Recorded in the same transaction as the alarm's state: a crash cannot lose them.
                for action in spec.actions:
                    session.add(
                        ActionRow(
                            job_name=job.name, alarm_name=alarm.name, action_name=str(action.get("name")),
                            status="Pending", created=time.time(), action=dict(action), extra=extra,
                        )
                    )  # fmt: skip

    def _stop_for_new_finding(
        self, session: Session, job: JobRow, alarm_name: str, spec: AlarmSpec, configuration: str, step: Any
    ) -> None:
        """Every breaching finding is put to the alarm's stop actions, not only the one that made it
        enter ALARM (actions/stop_policy.py): a certain finding after uncertain ones stops the job."""
        rule = session.get(RuleRow, (job.name, configuration))
        if rule is None or job.status != JobStatus.IN_PROGRESS or not any(map(is_stop_action, spec.actions)):
            return
        earlier = session.scalars(
            select(ActionRow.extra).where(ActionRow.job_name == job.name, ActionRow.alarm_name == alarm_name)
        )
        finding = finding_at(rule.findings, step)
        stops = restop_actions(spec.actions, finding, [(extra or {}).get("finding") for extra in earlier])
        reason = f"a finding at step {step} while the alarm stayed in ALARM"
        for action in stops:
            extra = {"alarm": alarm_name, "rule": configuration, "reason": reason, "finding": finding}
            session.add(ActionRow(job_name=job.name, alarm_name=alarm_name, action_name=str(action.get("name")),
                                  status="Pending", created=time.time(), action=action, extra=extra))  # fmt: skip

    def flush(self) -> None:
        """Run actions scheduled by committed alarm transitions; emit state-change events."""
        with self._jobs.lock:
            changed, self.changed = self.changed, set()
            with self._jobs.sessions() as session:
                pending = session.execute(
                    select(ActionRow.id, ActionRow.action_name, ActionRow.job_name)
                    .where(ActionRow.status == "Pending")
                    .order_by(ActionRow.id)
                ).all()
            fresh = [run for run in pending if run.id not in self._submitted]
            self._submitted.update(run.id for run in fresh)
        for run in fresh:
            self._dispatcher.submit(run.action_name, run.job_name, self._run_recorded, run.id)
        if self.settings.event_webhook_url:
            for job_name in changed:
                action = {"name": "webhook", "url": self.settings.event_webhook_url, "retries": 2}
                self._dispatcher.submit("webhook", job_name, self._emit_state_change, job_name, action)

    def resume(self) -> None:
        """After a restart: run actions still Pending; one that was Running when the API died is Failed."""
        with self._jobs.lock, self._jobs.sessions() as session:
            for row in session.scalars(select(ActionRow).where(ActionRow.status == "Running")):
                row.status, row.finished = JobStatus.FAILED.value, time.time()
                row.detail = "interrupted by an API restart before it finished (not retried: it may have run)"
            session.commit()
        self.flush()

    def context(self, job_name: str) -> ActionContext:
        # A job's actions act for the job's owner: a stoptraining prefix matches and stops only
        # jobs that owner may stop, never another tenant's.
        jobs = self._jobs
        owner = Caller(jobs.job_for(OPERATOR_CALLER, job_name).owner)

        def in_progress() -> list[str]:
            return [job.name for job in jobs.list_jobs(status=JobStatus.IN_PROGRESS.value, caller=owner, action="stop")]

        def stop_job(name: str, grace: float | None, cause: str) -> None:
            jobs.stop(name, grace, cause, caller=owner)

        return ActionContext(
            job_name=job_name, stop_job=stop_job, in_progress_jobs=in_progress, smtp=dict(self.settings.smtp),
            sns_endpoint_url=self.settings.sns_endpoint_url, region=self.settings.region, outbound=self._outbound,
        )  # fmt: skip

    def _run_recorded(self, run_id: int) -> None:
        with self._jobs.lock, self._jobs.sessions() as session:
            row = session.get(ActionRow, run_id)
            if row is None or row.status != "Pending":
                return
            row.status = "Running"
            session.commit()
            job_name, action, extra = row.job_name, dict(row.action or {}), dict(row.extra or {})
        try:
            detail = self._run_action(job_name, action, extra)
            status = "Succeeded"
        except Exception as error:  # noqa: BLE001 - an action failure is recorded, never crashes the API
            log.warning("action %s for %s failed: %s", action.get("name"), job_name, error)
            status, detail = JobStatus.FAILED.value, f"{type(error).__name__}: {error}"
        with self._jobs.lock, self._jobs.sessions() as session:
            row = session.get(ActionRow, run_id)
            row.status, row.detail, row.finished = status, str(detail)[:2000], time.time()
            session.commit()

    def _run_action(self, job_name: str, action: dict[str, Any], extra: dict[str, Any]) -> str:
        event = build_event(
            self._jobs.describe_sagemaker(job_name),
            account=self.settings.account_id,
            region=self.settings.region,
            extra={**extra, "event_id": str(uuid.uuid4())},
        )
        return get_handler(str(action.get("name")))(event, action, self.context(job_name))

    def _emit_state_change(self, job_name: str, action: dict[str, Any]) -> None:
        try:
            self._run_action(job_name, action, {"reason": "state change"})
        except Exception as error:  # noqa: BLE001 - best effort, like EventBridge delivery to a dead target
            log.warning("state-change event for %s not delivered: %s", job_name, error)
