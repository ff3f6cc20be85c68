"""Stop actions run on their own path: in order per job, never queued behind notifications.

The unit test drives the dispatcher with notifications that block; the live test runs the real
API with several slow webhook receivers on one job and measures another job's stoptraining.
"""

from __future__ import annotations

import threading
import time

import pytest

from trainguard.services.actions.dispatch import ActionDispatcher, PerKeySerialExecutor
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, training_command, wait_for
from tests.services.notify_servers import RecordingHttpServer


def test_stop_actions_run_while_every_notification_worker_is_blocked() -> None:
    dispatcher = ActionDispatcher(stop_workers=2, notification_workers=4)
    release = threading.Event()
    ran: list[str] = []
    try:
        for _ in range(20):  # more slow notifications than workers: a shared pool would queue the stop
            dispatcher.submit("webhook", "job-b", release.wait, 30)
        done = threading.Event()
        started = time.monotonic()
        dispatcher.submit("stoptraining", "job-a", lambda: (ran.append("stop"), done.set()))
        assert done.wait(5), "the stop action waited behind the notifications"
        assert time.monotonic() - started < 1.0 and ran == ["stop"]
    finally:
        release.set()
        dispatcher.close()


def test_a_jobs_stop_actions_run_one_at_a_time_in_order_other_jobs_in_parallel() -> None:
    executor = PerKeySerialExecutor(workers=4, thread_name_prefix="test-stop")
    order: dict[str, list[int]] = {"a": [], "b": []}
    running = {"a": 0, "b": 0}
    overlap: list[str] = []
    b_done = threading.Event()
    lock = threading.Lock()

    def task(key: str, index: int, seconds: float) -> None:
        with lock:
            running[key] += 1
            if running[key] > 1:
                overlap.append(key)
        time.sleep(seconds)
        with lock:
            running[key] -= 1
            order[key].append(index)
        if key == "b":
            b_done.set()

    try:
        for index in range(5):
            executor.submit("a", task, "a", index, 0.1)
        executor.submit("a", lambda: 1 / 0)  # a failing task does not drop the ones after it
        executor.submit("a", task, "a", 5, 0.0)
        executor.submit("b", task, "b", 0, 0.0)
        assert b_done.wait(0.4), "job b's stop waited behind job a's"
        wait_for(lambda: len(order["a"]) == 6, 5, "job a's stops")
    finally:
        executor.shutdown()
    assert order["a"] == [0, 1, 2, 3, 4, 5] and overlap == []


def _overlapping(actions: list[dict], start: float, end: float) -> int:
    """How many of ``actions`` were recorded before ``start`` and still unfinished at ``end``."""
    return sum(1 for a in actions if a["created"] <= start and (a["finished"] is None or a["finished"] >= end))


@pytest.mark.slow
def test_a_stoptraining_is_not_delayed_by_slow_webhooks_of_another_job(api_factory) -> None:
    """Job B fires 30 webhooks at a receiver that answers after 30 s (each held 5 s per attempt, 11
    attempts); while they hold every notification worker, job A's rule fires stoptraining."""
    with RecordingHttpServer(delay=30) as slow:
        api = api_factory(TRAINGUARD_WEBHOOK_ALLOW="127.0.0.1")
        hooks = [{"name": "webhook", "url": f"{slow.url}?n={n}", "retries": 10} for n in range(10)]
        noisy = {
            "name": "noisy-job",
            "command": training_command("--steps", "400", "--blowup-at", "2", "--step-seconds", "0.05"),
            "hook_config": HOOK_EVERY_STEP,
            "rules": [{"rule": CUSTOM_RULE, "name": "LossBlowup", "actions": hooks}],
            "alarms": [{"name": f"also-{n}", "rule": "LossBlowup", "actions": hooks} for n in range(2)],
        }  # fmt: skip
        status, body = api.request("POST", "/v1/jobs", noisy)
        assert status == 201, body
        wait_for(lambda: slow.attempts >= 8, 120, "the slow webhooks to hold the notification workers")
        stopped = {
            "name": "stopped-job",
            "command": training_command("--steps", "4000", "--blowup-at", "3", "--step-seconds", "0.05"),
            "hook_config": HOOK_EVERY_STEP,
            "rules": [{"rule": CUSTOM_RULE, "name": "LossBlowup", "actions": [{"name": "stoptraining"}]}],
        }
        status, body = api.request("POST", "/v1/jobs", stopped)
        assert status == 201, body
        job = wait_for(lambda: (j := api.job("stopped-job"))["status"] == "Stopped" and j, 180, "the stop")
        noisy_actions = api.job("noisy-job")["actions"]
    [stop] = job["actions"]
    assert stop["action"] == "stoptraining" and stop["status"] == "Succeeded", stop
    delay = stop["finished"] - stop["created"]
    stopping = next(t for t in job["secondary_status_transitions"] if t["status"] == "Stopping")
    to_stopped = job["training_end_time"] - stop["created"]
    busy = _overlapping(noisy_actions, stop["created"], stop["finished"])
    print(f"stoptraining: recorded -> done {delay:.2f} s, recorded -> Stopping {stopping['start_time'] - stop['created']:.2f} s,"
          f" recorded -> Stopped {to_stopped:.2f} s; the other job's webhooks in flight or queued meanwhile: {busy}"
          f" of {len(noisy_actions)}")
    assert busy >= 8  # every notification worker was held by a slow webhook while the stop ran
    assert delay < 2.0
    assert to_stopped < 10.0  # within the stop grace of the test API (TRAINGUARD_STOP_GRACE_SECONDS=10)
