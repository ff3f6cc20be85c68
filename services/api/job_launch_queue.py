"""Launches accepted jobs in the background, a few at a time.

CreateTrainingJob answers as soon as the job's rows are committed (InProgress / Starting), as
SageMaker does; starting the processes or containers (fork/exec, image pulls) waits in this queue.
With the launch inside the request, every request would pay for the launches queued before it.

Launches wait for a burst of creations to settle: a launch starts once no job was accepted for
``settle_seconds``, or once its job has waited ``max_delay_seconds``, whichever comes first.
Starting a job (interpreters importing torch, files, fork/exec) is CPU the API needs to answer
the burst, so launches are held until the burst ends.
A job starts at most ``max_delay_seconds`` later for it, as SageMaker's instances start minutes
after CreateTrainingJob answers; a stream of creations longer than that does not starve the
launches: a job that waited ``max_delay_seconds`` starts whatever arrives.

A launch that fails moves its job to Failed with the reason (never a job that stays Starting):
the caller passes ``on_failure``. A job queued when the API stopped is queued again at start-up by
the service (JobService.resume_launches), so it is launched or failed, never left stuck.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from trainguard.services.api.db import ComponentRow, JobRow
from trainguard.services.api.planner import plan_job
from trainguard.services.api.schemas import JobSpec
from trainguard.services.api.settings import Settings
from trainguard.services.launchers.base import JobLaunch, Launcher, LauncherError, LaunchRefused

log = logging.getLogger(__name__)


class JobLaunchQueue:
    """A bounded pool of launch workers; ``submit`` never blocks the request that calls it."""

    def __init__(self, workers: int = 2, *, settle_seconds: float = 0.0, max_delay_seconds: float = 0.0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if not 0 <= settle_seconds <= 60 or not 0 <= max_delay_seconds <= 600:
            raise ValueError("settle_seconds must be within 0-60 and max_delay_seconds within 0-600")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainguard-launch")
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.settle_seconds = settle_seconds
        self.max_delay_seconds = max_delay_seconds
        self._last_accepted = 0.0  # monotonic time of the latest submit
        self._closing = threading.Event()

    def submit(self, name: str, launch: Callable[[], None], on_failure: Callable[[BaseException], None]) -> bool:
        """Queue ``launch`` for job ``name``; False when that job is queued already."""
        accepted = time.monotonic()
        with self._lock:
            if name in self._queued:
                return False
            self._queued.add(name)
            self._last_accepted = accepted
        self._executor.submit(self._run, name, launch, on_failure, accepted)
        return True

    def _wait_for_the_burst(self, accepted: float) -> None:
        """Until no job was accepted for settle_seconds, or this one has waited max_delay_seconds."""
        deadline = accepted + self.max_delay_seconds
        while not self._closing.is_set():
            now = time.monotonic()
            with self._lock:
                quiet_at = self._last_accepted + self.settle_seconds
            wake = min(quiet_at, deadline)
            if now >= wake:
                return
            self._closing.wait(wake - now)

    def _run(
        self, name: str, launch: Callable[[], None], on_failure: Callable[[BaseException], None], accepted: float
    ) -> None:
        try:
            if self.settle_seconds and self.max_delay_seconds:
                self._wait_for_the_burst(accepted)
            launch()
        except BaseException as error:  # noqa: BLE001 - every failure ends the job, none is lost
            log.warning("launching job %s failed: %s", name, error)
            try:
                on_failure(error)
            except Exception:  # noqa: BLE001 - the reconciler still sees the job
                log.exception("recording the launch failure of %s failed", name)
        finally:
            with self._lock:
                self._queued.discard(name)
                self._idle.notify_all()

    def queued(self, name: str) -> bool:
        with self._lock:
            return name in self._queued

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued (tests, shutdown); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._queued, timeout)

    def close(self) -> None:
        self._closing.set()  # launches waiting for a burst to settle go now, not after it
        self._executor.shutdown(wait=False, cancel_futures=False)


class _LaunchingService(Protocol):
    """What :class:`JobLaunching` uses of the job service it is part of."""

    launcher: Launcher
    launch_queue: JobLaunchQueue
    starting: set[str]
    lock: threading.RLock
    sessions: sessionmaker
    settings: Settings

    def _finish(self, session: Session, job: JobRow, status: str, secondary: str, reason: str = "") -> None: ...

    def _rows(self, session: Session, model: type[ComponentRow], name: str, order: Any) -> list[Any]: ...

    def flush_notifications(self) -> None: ...

    def _queue_launch(self, name: str, launch: JobLaunch) -> None: ...

    def _launch_failed(self: _LaunchingService, name: str, error: BaseException) -> None: ...


class JobLaunching:
    """JobService's side of the launch queue (kept here so that jobs.py stays small), against what
    it needs of the service (:class:`_LaunchingService`)."""

    def _queue_launch(self: _LaunchingService, name: str, launch: JobLaunch) -> None:
        self.starting.add(name)

        def run() -> None:
            try:
                self.launcher.start(launch)
            finally:
                self.starting.discard(name)

        if not self.launch_queue.submit(name, run, lambda error: self._launch_failed(name, error)):
            log.info("job %s is queued for launch already", name)

    def _launch_failed(self: _LaunchingService, name: str, error: BaseException) -> None:
        """A job accepted but not launchable: stop what part of it started, then Failed with why."""
        try:
            self.launcher.stop(name, None, 0)
        except Exception as stop_error:  # noqa: BLE001 - nothing may have started
            log.info("cleaning up the unlaunchable job %s: %s", name, stop_error)
        if isinstance(error, (LauncherError, OSError)) and not isinstance(error, LaunchRefused):
            reason = f"InternalServerError: the launcher could not start the job: {error}"
        else:  # the back-end refused the request's content (LaunchRefused), or could not pass a value on
            reason = f"ClientError: the job could not be launched: {error}"
        with self.lock, self.sessions() as session:
            job = session.get(JobRow, name)
            if job is not None and not job.settled:
                self._finish(session, job, "Failed", "Failed", reason)
                session.commit()
        self.flush_notifications()

    def resume_launches(self: _LaunchingService) -> list[str]:
        """At start-up: queue again every job accepted but not launched when the API stopped.

        Such a job is unsettled, still Starting, and none of its components was ever seen by the
        reconciler (all Pending). Starting is idempotent in the launchers, so a launch the API died
        in the middle of completes; a job that cannot be planned any more ends Failed.
        """
        with self.sessions() as session:
            rows = list(session.scalars(select(JobRow).where(JobRow.settled.is_(False))))
            pending = []
            for job in rows:
                states = {row.state for row in self._rows(session, ComponentRow, job.name, ComponentRow.role)}
                if job.secondary_status == "Starting" and states <= {"Pending"}:
                    pending.append((job.name, dict(job.spec), job.runner_token))
        for name, spec_data, token in pending:
            try:
                launch = plan_job(JobSpec.model_validate(spec_data), self.settings, self.launcher.name, token)
            except Exception as error:  # noqa: BLE001 - the job ends Failed, never stuck Starting
                self._launch_failed(name, error)
                continue
            log.info("job %s was accepted but not launched before the restart: launching it now", name)
            self._queue_launch(name, launch)
        return [name for name, _, _ in pending]
