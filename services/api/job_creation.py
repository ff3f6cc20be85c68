"""Creating a job's rows: building them, name claims and group commit.

A creation is acknowledged only once its rows are durable (a commit with its fsync). An fsync is
slow while jobs start beside the API, and one creation at a time behind one lock would pay for
every fsync queued before it. Here creations that arrive while a
commit is in flight are written together by the next one, in one transaction and one fsync
(group commit, as databases do for their own logs), so a creation waits for at most about two
commits whatever the number of clients.

A name is claimed in memory before its directory is planned, so two creations of one name in
this process never both write its files; a second API process on the same database is caught by
the database's unique index at the commit (IntegrityError for that creation only).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker
from trainguard.services.alarms import AlarmSpec, implicit_rule_alarm
from trainguard.services.api.db import AlarmRow, Base, ComponentRow, JobRow, RuleRow, TransitionRow
from trainguard.services.api.schemas import JobSpec
from trainguard.services.api.settings import Settings
from trainguard.services.errors import ServiceError
from trainguard.services.launchers.base import JobLaunch, Launcher, launcher_support
from trainguard.services.sagemaker_container.contract import CONTRACT_ENV

__all__ = ["GroupCommit", "NameClaims", "NameTaken", "check_launchable", "new_job_rows"]
# Characters no path handed to an engine or a process may hold (C0 controls and DEL).
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_launchable(spec: JobSpec, launcher: Launcher) -> None:
    """Refuse, as ValueError 'field: why', what ``launcher`` says it cannot run (launcher_support):
    more training instances than it runs, or a working directory it cannot take."""
    from trainguard.services.api.planner import instance_count

    support = launcher_support(launcher)
    count = instance_count(spec)
    if count > support.max_instance_count:
        field = "ResourceConfig.InstanceCount" if CONTRACT_ENV in spec.environment else "resources.instance_count"
        raise ValueError(
            f"{field}: {count} instances, but the {launcher.name!r} launcher runs at most "
            f"{support.max_instance_count} per job (the ray launcher runs several)"
        )
    if spec.working_dir and support.container_paths:
        check_container_path(spec.working_dir, "working_dir")


def check_container_path(path: str, field: str) -> None:
    """A directory inside a job's container: absolute, without '..' or control characters
    (the engine creates it in the container; it names nothing on the API's host)."""
    if _CONTROL.search(path):
        raise ValueError(f"{field}: {path[:64]!r} must not contain control characters")
    posix = PurePosixPath(path)
    if not posix.is_absolute():
        raise ValueError(f"{field}: {path[:64]!r} must be an absolute path inside the container, e.g. /opt/ml/code")
    if ".." in posix.parts:
        raise ValueError(f"{field}: {path[:64]!r} must not contain '..'")


class NameTaken(ServiceError):
    """The job name is taken: by a job in the database or by a creation in flight."""


class NameClaims:
    """Names of the creations in flight in this process."""

    def __init__(self, sessions: sessionmaker) -> None:
        self._sessions = sessions
        self._lock = threading.Lock()
        self._claimed: set[str] = set()

    @contextlib.contextmanager
    def claim(self, name: str) -> Iterator[None]:
        """Hold ``name`` for one creation; NameTaken if a job or another creation has it."""
        with self._lock:
            if name in self._claimed:
                raise NameTaken(name)
            self._claimed.add(name)
        try:
            with self._sessions() as session:
                if session.get(JobRow, name) is not None:
                    raise NameTaken(name)
            yield
        finally:
            with self._lock:
                self._claimed.discard(name)


@dataclass
class _Creation:
    job: JobRow
    children: Sequence[Base]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class GroupCommit:
    """Writes the rows of concurrent creations in shared transactions.

    The caller that finds no commit in flight becomes the writer: it takes every creation queued
    so far (its own included) and commits them together; creations queued meanwhile wait for the
    next writer. ``commit`` returns once the caller's own rows are committed, or raises why not.
    """

    def __init__(self, sessions: sessionmaker) -> None:
        self._sessions = sessions
        self._queue_lock = threading.Lock()
        self._queue: list[_Creation] = []
        self._commit_lock = threading.Lock()

    def commit(self, job: JobRow, children: Sequence[Base]) -> None:
        """Commit ``job`` and then ``children`` (rows whose foreign keys point at it).

        Raises IntegrityError when the database refuses this creation's rows (the name was taken
        by another process meanwhile), or whatever else the database raised.
        """
        creation = _Creation(job, children)
        with self._queue_lock:
            self._queue.append(creation)
        with self._commit_lock:
            if not creation.done.is_set():
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._commit_batch(batch)
        if creation.error is not None:
            raise creation.error

    def _commit_batch(self, batch: list[_Creation]) -> None:
        try:
            self._write(batch)
        except IntegrityError as error:
            if len(batch) == 1:
                batch[0].error = error
            else:  # one refused creation must not refuse the others: write them one by one
                for creation in batch:
                    try:
                        self._write([creation])
                    except Exception as single_error:  # noqa: BLE001 - handed to that creation's caller
                        creation.error = single_error
        except Exception as error:  # noqa: BLE001 - every creation of the batch learns it failed
            for creation in batch:
                creation.error = error
        finally:
            for creation in batch:
                creation.done.set()

    def _write(self, batch: list[_Creation]) -> None:
        with self._sessions() as session:
            try:
                # Jobs first: their children's foreign keys point at them.
                session.add_all([creation.job for creation in batch])
                session.flush()
                session.add_all([row for creation in batch for row in creation.children])
                session.commit()
            except BaseException:
                session.rollback()
                # The rows go back to transient, so a retry (one by one) can add them again.
                session.expunge_all()
                raise


def _processing_job_arn(settings: Settings, job: str, configuration: str) -> str:
    slug = re.sub(r"[^a-z0-9-]", "-", configuration.lower()).strip("-") or "rule"
    name = f"{job[:26]}-{slug}"[:54].strip("-") + f"-{secrets.token_hex(4)}"
    return f"arn:aws:sagemaker:{settings.region}:{settings.account_id}:processing-job/{name}"


def _class_fix_hint(rule: str) -> str:
    try:
        from trainguard.rules import get_rule_class

        return str(getattr(get_rule_class(rule), "fix_hint", "") or "")
    except Exception:  # noqa: BLE001 - a hint is optional; the rule is validated elsewhere
        return ""


def new_job_rows(
    spec: JobSpec,
    launch: JobLaunch,
    settings: Settings,
    launcher_name: str,
    *,
    source: str,
    request: dict[str, Any] | None,
    unavailable_rules: Sequence[dict[str, str]],
    runner_token: str,
    now: float,
) -> tuple[JobRow, list[Any]]:
    """A new job's row and the rows that belong to it: its first transition, components, rules, alarms."""
    arn = f"arn:aws:sagemaker:{settings.region}:{settings.account_id}:training-job/{spec.name}"
    job_row = JobRow(
        name=spec.name, arn=arn, source=source, spec=spec.model_dump(mode="json"), request=request,
        launcher=launcher_name, runner_token=runner_token, status="InProgress", secondary_status="Starting",
        failure_reason="", creation_time=now, last_modified_time=now, stop_status="", stop_cause="",
        settled=False,
    )  # fmt: skip
    transition = TransitionRow(
        job_name=spec.name, status="Starting", start_time=now, message="Launching the job's components"
    )
    rule_rows: list[RuleRow] = []
    alarm_rows: list[AlarmRow] = []
    component_rows: list[ComponentRow] = []
    for rule in spec.rules:
        rule_rows.append(
            RuleRow(
                job_name=spec.name, configuration_name=rule.configuration_name, kind=rule.kind, rule=rule.rule,
                evaluation_job_arn=_processing_job_arn(settings, spec.name, rule.configuration_name),
                launched=True, status="InProgress", status_details="", last_modified_time=now, findings=[],
                missing=[], fix_hint=_class_fix_hint(rule.rule), actions=list(rule.actions),
            )
        )  # fmt: skip
        if rule.actions:
            alarm = implicit_rule_alarm(rule.configuration_name, rule.actions)
            alarm_rows.append(AlarmRow(job_name=spec.name, name=alarm.name, spec=alarm.to_dict(), updated=now))
    for unavailable in unavailable_rules:
        rule_rows.append(
            RuleRow(
                job_name=spec.name, configuration_name=unavailable["name"], kind=unavailable["kind"],
                rule=unavailable["rule"], launched=False, status="Error", status_details=unavailable["reason"],
                evaluation_job_arn=_processing_job_arn(settings, spec.name, unavailable["name"]),
                last_modified_time=now, findings=[], missing=[], fix_hint="", actions=[],
            )
        )  # fmt: skip
    for alarm_config in spec.alarms:
        alarm = AlarmSpec.from_dict(alarm_config.model_dump())
        alarm_rows.append(AlarmRow(job_name=spec.name, name=alarm.name, spec=alarm.to_dict(), updated=now))
    for component in launch.components:
        component_rows.append(
            ComponentRow(job_name=spec.name, role=component.role, state="Pending", updated=now, reason="")
        )
    return job_row, [transition, *component_rows, *rule_rows, *alarm_rows]
