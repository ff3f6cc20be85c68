"""Where action runs execute: stop actions on their own path, notifications on theirs.

A stop is what protects the cluster from a job gone wrong; a notification only tells someone.
Sharing one pool let a few slow webhook receivers hold every worker while another job's
stoptraining waited in the queue. Stop actions therefore run on a dedicated executor that no
notification ever enters, one at a time per job in the order they were recorded (a job's later
stop, e.g. with another grace, never overtakes its earlier one), different jobs in parallel.
Notifications (webhooks, e-mail, SNS, custom handlers, state-change events) share a bounded pool
and each attempt of theirs is bounded in time by its handler.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["STOP_ACTIONS", "ActionDispatcher", "PerKeySerialExecutor"]

log = logging.getLogger("trainguard.actions")

STOP_ACTIONS = frozenset({"stoptraining"})

Task = tuple[Callable[..., Any], tuple[Any, ...]]


class PerKeySerialExecutor:
    """Runs tasks of one key one after another, in submission order; tasks of different keys in parallel."""

    def __init__(self, workers: int, thread_name_prefix: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Task]] = {}  # keys with a task running; their waiting tasks

    def submit(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            waiting = self._queues.get(key)
            if waiting is not None:  # this key's drain is running: it picks the task up in order
                waiting.append((fn, args))
                return
            self._queues[key] = deque()
        try:
            self._pool.submit(self._drain, key, (fn, args))
        except RuntimeError:  # shut down: the key must not stay marked as running
            with self._lock:
                del self._queues[key]
            raise

    def _drain(self, key: str, task: Task) -> None:
        while True:
            fn, args = task
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one task's failure must not drop the key's later tasks
                log.exception("action task for %s failed", key)
            with self._lock:
                waiting = self._queues[key]
                if not waiting:
                    del self._queues[key]
                    return
                task = waiting.popleft()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=False)


class ActionDispatcher:
    """Routes each action run to the stop path or the notification pool by the action's name."""

    def __init__(self, *, stop_workers: int = 2, notification_workers: int = 8) -> None:
        self._stops = PerKeySerialExecutor(stop_workers, "trainguard-stop-action")
        self._notifications = ThreadPoolExecutor(
            max_workers=notification_workers, thread_name_prefix="trainguard-notify"
        )

    @staticmethod
    def is_stop(action_name: str) -> bool:
        return action_name.lower() in STOP_ACTIONS

    def submit(self, action_name: str, job_name: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the path of ``action_name``; stop actions of ``job_name`` in order."""
        if self.is_stop(action_name):
            self._stops.submit(job_name, fn, *args)
        else:
            self._notifications.submit(fn, *args)

    def close(self) -> None:
        self._stops.shutdown()
        self._notifications.shutdown(wait=False, cancel_futures=False)
