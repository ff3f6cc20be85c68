"""Launches accepted jobs in the background, a few at a time.

CreateTrainingJob answers as soon as the job's rows are committed (InProgress / Starting), as
SageMaker does; starting the processes or containers (fork/exec, image pulls) waits in this queue.
With the launch inside the request, 10 concurrent clients saw create p95 of seconds on a 2-core
machine (bench/load_api.py): every request paid for the launches queued before it.

A launch that fails moves its job to Failed with the reason (never a job that stays Starting):
the caller passes ``on_failure``. A job queued when the API stopped is queued again at start-up by
the service (JobService.resume_launches), so it is launched or failed, never left stuck.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class JobLaunchQueue:
    """A bounded pool of launch workers; ``submit`` never blocks the request that calls it."""

    def __init__(self, workers: int = 2) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trainguard-launch")
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def submit(self, name: str, launch: Callable[[], None], on_failure: Callable[[BaseException], None]) -> bool:
        """Queue ``launch`` for job ``name``; False when that job is queued already."""
        with self._lock:
            if name in self._queued:
                return False
            self._queued.add(name)
        self._executor.submit(self._run, name, launch, on_failure)
        return True

    def _run(self, name: str, launch: Callable[[], None], on_failure: Callable[[BaseException], None]) -> None:
        try:
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
        self._executor.shutdown(wait=False, cancel_futures=False)
