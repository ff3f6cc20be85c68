"""A thread that follows the launcher and moves jobs through SageMaker's lifecycle.

InProgress (Starting -> Training -> Uploading) -> Completed; Failed with the exit code and the
reason; Stopping -> Stopped (or MaxRuntimeExceeded). Rule runners that exit are mapped to rule
statuses by their exit code (0 NoIssuesFound, 1 IssuesFound, other Error) unless they reported
a final status themselves; when a job stops or fails, its rule runners are stopped too.

Everything is read back from the database and the launcher on each tick, so a restarted API
re-attaches to running jobs with no extra step.

Supervision (nothing lost): an uploader that dies (killed, crashed) while its job is in progress
is restarted through the launcher and resumes from its state file, up to a few times; one that
cannot be restarted, or gave up on S3 itself, fails the job at once, while training still runs,
with the uploader's last words (the files not on S3) as the reason. Once training has ended the
uploader is told so (SIGTERM) once its status file (services/uploader/status.py, read through
the launcher) says it is ready: it sends what is left, verifies S3 and writes the end marker, also
when training captured nothing. Without an uploader (local launcher) the reconciler writes the
end marker of a run that ended without one, so its rules end instead of waiting forever.
A rule runner killed by a signal other than a stop's SIGTERM is restarted the same way.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker
from trainguard.services.api.db import ComponentRow, JobRow, RuleRow, checkpoint_wal
from trainguard.services.api.jobs import JobService
from trainguard.services.api.planner import (
    LOCAL_PLAN_LAUNCHERS,
    RULE_ROLE_PREFIX,
    UPLOADER_FINISH_GRACE_S,
    job_dir,
    rule_role,
    uploader_status_file,
)
from trainguard.services.launchers.base import ComponentState, ComponentStatus, read_component_file
from trainguard.services.sagemaker_container.contract import failure_reason_from_log
from trainguard.services.uploader.status import STATUS_MAX_BYTES, UploaderStatus, parse_status

from trainguard.format.layout import END_OF_TRAINING
from trainguard.statuses import RULE_TERMINAL

__all__ = ["Reconciler"]

log = logging.getLogger("trainguard.reconciler")
_ACTIVE = (ComponentState.RUNNING, ComponentState.PENDING)
_RULE_STOP_GRACE = 10.0
_UPLOADER_ROLE = "uploader"
_UPLOADER_RESTARTS = 5  # per job; each resumes from the state file, so a restart costs no re-upload
# Exit codes restarting cannot help: 1 = S3 kept failing past the uploader's own give-up time
# (its message names the files not on S3), 2 = bad arguments.
_UPLOADER_FINAL_CODES = (1, 2)
# After training exits the uploader normally finds the end marker within a poll or two; past this,
# it is told training is over (SIGTERM) so it finishes even when no end marker will ever come.
_UPLOADER_FINISH_AFTER_S = 5.0
# How long after training ended an uploader that never said it is ready is told to finish anyway.
_UPLOADER_READY_WAIT_S = 120.0
# The grace of the stop that tells an uploader training is over: it is not a stop but "send the
# rest, verify S3, write the end marker", which is bounded by the uploader's own give-up time
# (--give-up-after, 600 s by default: it exits 1 naming the files not on S3). The job's short stop
# grace (TRAINGUARD_STOP_GRACE_SECONDS) would SIGKILL an uploader still re-sending a run to an S3
# endpoint restarted empty, until its restarts were spent and a job whose every file did reach S3
# ended Failed.
_UPLOADER_FINISH_GRACE_S = UPLOADER_FINISH_GRACE_S  # the Ray launcher submits the uploader with it
# SQLite log checkpoints run here, off the requests' commits (services/api/db.py).
_CHECKPOINT_EVERY_S = 5.0
_RUNNER_RESTARTS = 3  # per rule runner of a job
# "ValueError: ...", "torch.OutOfMemoryError: ...", "RankFailed: ...": a line naming a failure.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Failure|Interrupt)\b.*?:")


def _fingerprint(statuses: dict[str, ComponentStatus]) -> tuple:
    return tuple(
        sorted((role, status.state.value, status.exit_code, status.reason) for role, status in statuses.items())
    )


class Reconciler:
    def __init__(self, service: JobService, interval: float, *, sessions: sessionmaker | None = None) -> None:
        """``sessions``: where the reconciler writes (default: the service's own sessions)."""
        self.service = service
        self.interval = interval
        self._sessions = sessions
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uploader_restarts: dict[str, int] = {}  # job -> restarts so far (since this API started)
        self._uploader_told: set[str] = set()  # jobs whose uploader was told training is over
        # job -> the attempt id in the status file its dead uploader left: not the restarted one's
        self._replaced_uploader: dict[str, str] = {}
        self._runner_restarts: dict[tuple[str, str], int] = {}  # (job, rule role) -> restarts so far
        self._last_checkpoint = time.monotonic()
        self._steady: dict[str, tuple] = {}  # job -> what its row and components were when last steady

    def _session(self) -> Session:
        return (self._sessions or self.service.sessions)()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="trainguard-reconciler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - keep following jobs whatever one tick hit
                log.exception("reconcile tick failed")
            self._stop.wait(self.interval)

    def tick(self) -> None:
        with self._session() as session:
            jobs = session.execute(
                select(JobRow.name, JobRow.status, JobRow.last_modified_time).where(JobRow.settled.is_(False))
            ).all()
        for name, status, modified in jobs:
            if name in self.service.starting:
                continue
            try:
                statuses = self.service.launcher.status(name)
            except Exception as error:  # noqa: BLE001 - the engine may be briefly unreachable
                log.warning("launcher status of %s failed: %s", name, error)
                continue
            # A job in a steady state whose row and components are as they were on the last tick
            # needs no transaction: most jobs, most of the time, are simply training, and
            # reconciling each of them every tick would hold the GIL the API's requests wait for.
            fingerprint = (status, modified, _fingerprint(statuses))
            if self._steady.get(name) == fingerprint:
                continue
            self._steady.pop(name, None)
            if self.reconcile_job(name, statuses):
                self._steady[name] = fingerprint
        if time.monotonic() - self._last_checkpoint > _CHECKPOINT_EVERY_S:
            self._last_checkpoint = time.monotonic()
            try:
                with self._session() as session:
                    bind = session.get_bind()
                if isinstance(bind, Engine):
                    checkpoint_wal(bind)
            except Exception as error:  # noqa: BLE001 - SQLite's own threshold still checkpoints
                log.warning("checkpointing the database log failed: %s", error)
        known = {name for name, _status, _modified in jobs}
        for name in [name for name in self._steady if name not in known]:
            del self._steady[name]  # settled (or gone): nothing to remember
        self.service.flush_notifications()

    def reconcile_job(self, name: str, statuses: dict[str, ComponentStatus]) -> bool:
        """Move one job on from what its components do. True when the job is in a steady state:
        training (or starting) with nothing timed pending (no max runtime, no stop, no uploader or
        rule runner to finish), so another tick with the same row and statuses would change nothing."""
        steady = self._is_steady_in_progress(statuses)
        service = self.service
        stop_rules: list[str] = []
        stop_all = False
        finish_uploader = False
        end_marker = False
        with service.lock, self._session() as session:
            job = session.get(JobRow, name)
            if job is None or job.settled:
                return False
            now = time.time()
            for role, status in statuses.items():
                row = session.get(ComponentRow, (name, role))
                if row is None:
                    row = ComponentRow(job_name=name, role=role, state="", updated=now, reason="")
                    session.add(row)
                if (row.state, row.exit_code, row.reason) != (status.state.value, status.exit_code, status.reason):
                    row.state, row.exit_code, row.reason, row.updated = (
                        status.state.value,
                        status.exit_code,
                        status.reason,
                        now,
                    )
            training = statuses.get("training")
            uploader = self._as_finished_if_it_finished(name, statuses.get("uploader"))
            max_runtime = (job.spec.get("stopping_condition") or {}).get("max_runtime_seconds")

            if job.status == "InProgress":
                if max_runtime and now - job.creation_time > float(max_runtime):
                    session.commit()
                    service.stop(
                        name, cause=f"MaxRuntimeInSeconds ({max_runtime}) exceeded", status="MaxRuntimeExceeded"
                    )
                    return False
                uploader_failure = self._supervise_uploader(name, uploader)
                if uploader_failure:
                    service._finish(session, job, "Failed", "Failed", uploader_failure)
                    stop_all = True
                elif training is None or training.state is ComponentState.MISSING:
                    if now - job.creation_time > 30:
                        service._finish(
                            session,
                            job,
                            "Failed",
                            "Failed",
                            "InternalServerError: the launcher has no training component for this job",
                        )
                        stop_all = True
                elif training.state is ComponentState.RUNNING and job.secondary_status == "Starting":
                    job.training_start_time = now
                    service._transition(session, job, "Training", "Training job running")
                elif training.state is ComponentState.EXITED:
                    if job.training_start_time is None:
                        job.training_start_time = now
                        service._transition(session, job, "Training", "Training job running")
                    job.exit_code = training.exit_code
                    if training.exit_code == 0:
                        service._transition(session, job, "Uploading", "Uploading generated training model")
                        training_row = session.get(ComponentRow, (name, "training"))
                        ended_for = now - training_row.updated if training_row is not None else 0.0
                        # Local rule runners read the run directory, also when an uploader copies it.
                        # Written after the commit: no file I/O while this transaction holds SQLite's
                        # write lock (creations wait behind it in the busy handler).
                        end_marker = True
                        if (
                            uploader is not None and uploader.state in _ACTIVE and ended_for > _UPLOADER_FINISH_AFTER_S
                            and name not in self._uploader_told
                        ):  # fmt: skip
                            finish_uploader = self._uploader_ready(name, ended_for)
                        if uploader is not None and uploader.state is ComponentState.EXITED and (
                            uploader.exit_code not in (0, None)
                        ):
                            pass  # restarted above; the job goes on Uploading
                        elif uploader is None or uploader.state not in _ACTIVE:
                            if uploader is not None and uploader.exit_code not in (0, None):
                                reason = f"InternalServerError: the uploader exited with code {uploader.exit_code}"
                                if uploader.reason:
                                    reason += f": {uploader.reason}"
                                tail = self._log_tail(name, _UPLOADER_ROLE)
                                service._finish(
                                    session, job, "Failed", "Failed", f"{reason}: {tail}" if tail else reason
                                )
                            else:
                                service._finish(session, job, "Completed", "Completed", "Training job completed")
                    else:
                        service._finish(session, job, "Failed", "Failed", self._failure_reason(name, training))
                        stop_all = True
            elif job.status == "Stopping":
                if training is None or training.state not in _ACTIVE:
                    if training is not None:
                        job.exit_code = training.exit_code
                    secondary = job.stop_status or "Stopped"
                    service._finish(session, job, "Stopped", secondary, job.stop_cause or "Training job stopped")
                    stop_all = True

            # Rule runners, whatever the job's status.
            active = False
            for rule in session.scalars(select(RuleRow).where(RuleRow.job_name == name)):
                if not rule.launched:
                    continue
                component = statuses.get(rule_role(rule.configuration_name))
                if component is None and job.status in ("InProgress", "Stopping"):
                    continue  # not started (yet): only a finished job's missing runner is an error
                running = component is not None and component.state in _ACTIVE
                active = active or running
                if running:
                    if job.status in ("Failed", "Stopped", "Stopping") and rule.status == "InProgress":
                        service.set_rule_status(session, job, rule, "Stopping")
                        stop_rules.append(rule_role(rule.configuration_name))
                    elif (
                        job.status == "Completed"
                        and job.training_end_time
                        and now - job.training_end_time > service.settings.rule_finish_timeout
                        and rule.status == "InProgress"
                    ):
                        service.set_rule_status(
                            session,
                            job,
                            rule,
                            "Error",
                            "ClientError: the rule did not finish within TRAINGUARD_RULE_FINISH_TIMEOUT "
                            "after training ended",
                        )
                        stop_rules.append(rule_role(rule.configuration_name))
                    continue
                if rule.status in RULE_TERMINAL:
                    continue
                if rule.status == "Stopping":
                    service.set_rule_status(session, job, rule, "Stopped")
                    continue
                if self._restart_killed_runner(job, rule, component):
                    active = True
                    continue
                self._rule_exited(session, job, rule, component)
            others_active = any(
                status.state in _ACTIVE for role, status in statuses.items() if not role.startswith(RULE_ROLE_PREFIX)
            )
            if job.status in ("Completed", "Failed", "Stopped") and not active and not others_active:
                job.settled = True
            elif job.status in ("Failed", "Stopped") and others_active:
                stop_all = True
            session.commit()
        steady = steady and job.status == "InProgress" and not max_runtime and not (stop_all or stop_rules)
        if end_marker:
            self._ensure_local_end_marker(name)
        if finish_uploader and not stop_all:
            self._uploader_told.add(name)
            log.info("training of %s ended: telling its uploader to finish (end marker last)", name)
            threading.Thread(
                target=service._launcher_stop,
                args=(name, (_UPLOADER_ROLE,), max(_UPLOADER_FINISH_GRACE_S, service.settings.stop_grace_seconds)),
                daemon=True,
            ).start()
        if stop_all:
            service._launcher_stop(name, None, service.settings.stop_grace_seconds)
        elif stop_rules:
            threading.Thread(
                target=service._launcher_stop, args=(name, tuple(stop_rules), _RULE_STOP_GRACE), daemon=True
            ).start()
        return steady

    @staticmethod
    def _is_steady_in_progress(statuses: dict[str, ComponentStatus]) -> bool:
        """Training pending or running, every other component running: the states a job stays in."""
        training = statuses.get("training")
        if training is None or training.state not in _ACTIVE:
            return False
        return all(status.state in _ACTIVE for status in statuses.values())

    def _supervise_uploader(self, name: str, uploader: ComponentStatus | None) -> str:
        """Restart a dead uploader; the job's failure reason when that cannot be done ("" otherwise)."""
        if uploader is None or uploader.state is not ComponentState.EXITED or uploader.exit_code in (0, None):
            return ""
        what = f"exit code {uploader.exit_code}" + (f", {uploader.reason}" if uploader.reason else "")
        tail = self._log_tail(name, _UPLOADER_ROLE)
        said = f": {tail}" if tail else ""
        if uploader.exit_code in _UPLOADER_FINAL_CODES:
            return f"InternalServerError: the uploader failed ({what}){said}"[:1024]
        restarts = self._uploader_restarts.get(name, 0)
        if restarts >= _UPLOADER_RESTARTS:
            return (
                f"InternalServerError: the uploader died {restarts + 1} times (last: {what}) "
                f"and is not restarted again; captured files may be missing from S3{said}"
            )[:1024]
        self._uploader_restarts[name] = restarts + 1
        self._uploader_told.discard(name)  # a restarted uploader must be told again that training ended
        try:
            dead = self._uploader_status(name)
        except Exception:  # noqa: BLE001 - then any document found later counts as the new one's
            dead = None
        if dead is not None:
            self._replaced_uploader[name] = dead.attempt
        log.warning("the uploader of %s died (%s): restarting it (restart %d)", name, what, restarts + 1)
        try:
            self.service.launcher.restart(name, _UPLOADER_ROLE)
        except Exception as error:  # noqa: BLE001 - LauncherError or the engine's own errors
            return f"InternalServerError: the uploader died ({what}) and could not be restarted: {error}"[:1024]
        return ""

    def _restart_killed_runner(self, job: JobRow, rule: RuleRow, component: ComponentStatus | None) -> bool:
        """A rule runner killed by a signal (not a stop: SIGTERM) is restarted, up to a few times.

        It resumes from its progress file and its report outbox replays what the API has not
        acknowledged, so a kill costs neither evaluations nor reports. An exit code of its own
        (0, 1, 2: a verdict or an error it reported) is a result, never restarted.
        """
        code = component.exit_code if component is not None else None
        if job.status not in ("InProgress", "Completed") or code is None or code <= 128 or code == 128 + 15:
            return False
        role = rule_role(rule.configuration_name)
        restarts = self._runner_restarts.get((job.name, role), 0)
        if restarts >= _RUNNER_RESTARTS:
            return False  # the usual Error status, with the exit code and the log's last line
        self._runner_restarts[(job.name, role)] = restarts + 1
        log.warning("rule runner %s of %s was killed (exit code %s): restarting it", role, job.name, code)
        try:
            self.service.launcher.restart(job.name, role)
        except Exception as error:  # noqa: BLE001 - then it ends in Error as before
            log.warning("could not restart %s of %s: %s", role, job.name, error)
            return False
        return True

    def _ensure_local_end_marker(self, name: str) -> None:
        """A local run that ended without an end marker (nothing captured) gets one, so rules end."""
        if self.service.launcher.name not in LOCAL_PLAN_LAUNCHERS:
            return
        from trainguard.services.launchers.local_isolation import create_in_workspace

        directory = job_dir(self.service.settings, name)
        marker = directory / "debug-output" / END_OF_TRAINING
        try:
            # The job owns its directory: never follow a link it planted there.
            if create_in_workspace(directory, "debug-output", END_OF_TRAINING):
                log.info("training of %s ended without an end marker (nothing captured?): wrote %s", name, marker)
        except OSError as error:
            log.warning("could not write the end marker %s: %s", marker, error)

    def _rule_exited(self, session: Session, job: JobRow, rule: RuleRow, component: ComponentStatus | None) -> None:
        service = self.service
        code = component.exit_code if component is not None else None
        if code == 0:
            service.set_rule_status(session, job, rule, "NoIssuesFound")
        elif code == 1:
            step = rule.last_evaluated_step
            details = (
                f"RuleEvaluationConditionMet: Evaluation of the rule {rule.configuration_name} at step {step} "
                "resulted in the condition being met\n"
            )
            service.set_rule_status(session, job, rule, "IssuesFound", details)
            service.add_datapoint(session, job, rule.configuration_name, "RuleIssuesFound", 1.0, step)
        else:
            tail = self._log_tail(job.name, rule_role(rule.configuration_name))
            reason = component.reason if component is not None else "the rule runner is gone"
            service.set_rule_status(
                session,
                job,
                rule,
                "Error",
                f"ClientError: the rule runner exited with code {code} ({reason}): {tail}"[:1024],
            )

    def _uploader_status(self, name: str) -> UploaderStatus | None:
        """What the job's current uploader last wrote in its status file (services/uploader/status.py);
        None when it wrote nothing yet, or only its dead predecessor's document is there. Raises
        what the launcher raises."""
        launcher = self.service.launcher
        path = uploader_status_file(self.service.settings, launcher.name, name)
        status = parse_status(read_component_file(launcher, name, _UPLOADER_ROLE, path, STATUS_MAX_BYTES))
        if status is None or status.attempt == self._replaced_uploader.get(name):
            return None
        return status

    def _uploader_ready(self, name: str, ended_for: float) -> bool:
        """Whether the uploader (since its last restart) has its SIGTERM handler in place: its status
        file says so once it has. Told earlier, a (re)started uploader still importing under load
        dies of the SIGTERM (exit 143), is restarted, told again, and the job fails once its
        restarts are spent. After a long wait it is told anyway, so a job whose uploader never
        says so (its disk full, or a launcher that cannot read its files) still ends."""
        if ended_for > _UPLOADER_FINISH_AFTER_S + _UPLOADER_READY_WAIT_S:
            return True
        try:
            status = self._uploader_status(name)
        except Exception:  # noqa: BLE001 - cannot tell: do not hold the job back
            return True
        return status is not None and status.ready

    def _as_finished_if_it_finished(self, name: str, uploader: ComponentStatus | None) -> ComponentStatus | None:
        """An uploader told that training ended, stopped by SIGTERM (143), whose status file says it
        finished (its last pass done, end marker last) is finished (exit 0). Ray reports every job
        ended by stop_job as STOPPED, whatever the process's own exit code, so without this a
        finished uploader would be supervised as a death and restarted until the job failed."""
        if (
            uploader is None or uploader.state is not ComponentState.EXITED or uploader.exit_code != 128 + 15
            or name not in self._uploader_told
        ):  # fmt: skip
            return uploader
        try:
            status = self._uploader_status(name)
        except Exception:  # noqa: BLE001 - cannot tell: supervise it as a death
            return uploader
        if status is not None and status.finished:
            return ComponentStatus(uploader.role, ComponentState.EXITED, 0, "finished after training ended")
        return uploader

    def _log_tail(self, name: str, role: str) -> str:
        """The log line that says why: the last error line ("RuntimeError: ...", "RankFailed: ...")
        among the last 40, else the last line. Output of other processes can follow the error
        (Ray forwards the other ranks' shutdown lines after the driver's own)."""
        try:
            lines = [line for line in self.service.launcher.logs(name, role, tail=40).splitlines() if line.strip()]
        except Exception:  # noqa: BLE001 - logs are a courtesy in the message
            return ""
        errors = [line for line in lines if _ERROR_LINE.match(line)]
        return (errors or lines or [""])[-1][:500]

    def _failure_reason(self, name: str, training: ComponentStatus) -> str:
        try:  # a SageMaker-contract job says why it failed (/opt/ml/output/failure) in its log
            written = failure_reason_from_log(self.service.launcher.logs(name, "training", tail=400))
        except Exception:  # noqa: BLE001 - the generic reason below still tells the exit code
            written = None
        if written:
            return written
        reason = f"AlgorithmError: training exited with code {training.exit_code}"
        if training.reason:
            reason += f" ({training.reason})"
        tail = self._log_tail(name, "training")
        return f"{reason}: {tail}" if tail else reason
