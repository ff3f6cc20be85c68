"""Creation answers once the job is committed; the launch runs in the background launch queue.

Real local launcher, real SQLite database, real training processes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.services.conftest import TOKEN, training_command

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402
from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.job_launch_queue import JobLaunchQueue  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402
from trainguard.services.launchers.local import LocalLauncher  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RECONCILE_INTERVAL": "0.2"}
    )  # fmt: skip


def _wait_status(client: TestClient, name: str, wanted: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{name}", headers=AUTH).json()
        if job["status"] in wanted or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def test_launcher_error_after_accepted_create_ends_the_job_failed_with_the_reason(tmp_path: Path) -> None:
    class BrokenEngine(LocalLauncher):
        def start(self, job) -> None:  # noqa: ANN001 - a JobLaunch
            raise OSError("engine unreachable")

    with TestClient(create_app(_settings(tmp_path), launcher=BrokenEngine(tmp_path / "local"))) as client:
        response = client.post("/v1/jobs", headers=AUTH, json={"name": "no-engine", "command": training_command()})
        assert response.status_code in (200, 201), response.text
        assert response.json()["status"] == "InProgress"
        job = _wait_status(client, "no-engine", {"Failed"}, 20)
        assert job["status"] == "Failed", job
        assert "the launcher could not start the job: engine unreachable" in job["failure_reason"], job


def test_a_job_queued_for_launch_when_the_api_stopped_is_launched_after_the_restart(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    first = create_app(settings)
    with TestClient(first) as client:
        service = first.state.service
        service.launch_queue.submit = lambda *args: True  # the API dies before the queue ran the launch
        spec = {"name": "queued-job", "command": training_command("--steps", "5", "--step-seconds", "0.01")}
        response = client.post("/v1/jobs", headers=AUTH, json=spec)
        assert response.status_code in (200, 201), response.text
        time.sleep(1.0)  # several reconciler ticks: it leaves a job being launched alone
        job = client.get("/v1/jobs/queued-job", headers=AUTH).json()
        assert (job["status"], job["secondary_status"]) == ("InProgress", "Starting"), job
        assert not (tmp_path / "local" / "queued-job").exists()  # nothing was started
    with TestClient(create_app(settings)) as client:  # the restarted API, same database
        # a 5-step torch run: seconds here, but over a minute when the machine is at load 80
        job = _wait_status(client, "queued-job", {"Completed", "Failed", "Stopped"}, timeout=240)
        assert job["status"] == "Completed", job
        assert job["exit_code"] == 0, job


def test_launch_queue_runs_each_job_once_and_reports_failures() -> None:
    queue = JobLaunchQueue(workers=2)
    ran: list[str] = []
    failed: list[str] = []
    try:
        assert queue.submit("a", lambda: (time.sleep(0.2), ran.append("a")), lambda e: failed.append(str(e)))
        assert not queue.submit("a", lambda: ran.append("again"), lambda e: None)  # queued already

        def boom() -> None:
            raise RuntimeError("boom")

        assert queue.submit("b", boom, lambda e: failed.append(str(e)))
        assert queue.wait_idle(5)
        assert ran == ["a"] and failed == ["boom"]
    finally:
        queue.close()
    with pytest.raises(ValueError):
        JobLaunchQueue(workers=0)


def _launch_times(queue: JobLaunchQueue, names: list[str], every: float) -> tuple[dict[str, float], list[float]]:
    """Submit ``names`` one every ``every`` seconds; when each was accepted and when it launched.
    Closes ``queue``."""
    launched: dict[str, float] = {}
    accepted: list[float] = []
    try:
        for name in names:
            accepted.append(time.monotonic())
            assert queue.submit(name, lambda name=name: launched.__setitem__(name, time.monotonic()), lambda e: None)
            time.sleep(every)
        assert queue.wait_idle(10)
    finally:
        queue.close()
    return launched, accepted


def test_launches_wait_until_a_burst_of_creations_settles() -> None:
    queue = JobLaunchQueue(workers=2, settle_seconds=0.4, max_delay_seconds=5.0)
    launched, accepted = _launch_times(queue, [f"job-{i}" for i in range(6)], every=0.1)
    last = accepted[-1]
    assert len(launched) == 6
    # nothing started while creations kept coming (one every 0.1 s < 0.4 s of quiet)
    assert min(launched.values()) >= last + 0.35, (min(launched.values()) - last)
    assert max(launched.values()) <= last + 2.0


def test_a_long_stream_of_creations_does_not_hold_launches_past_the_max_delay() -> None:
    queue = JobLaunchQueue(workers=2, settle_seconds=0.4, max_delay_seconds=0.5)
    launched, accepted = _launch_times(queue, [f"job-{i}" for i in range(20)], every=0.1)
    waits = [launched[f"job-{i}"] - accepted[i] for i in range(20)]
    # the stream never goes quiet for 0.4 s, so each job starts once it waited its 0.5 s; the
    # last few, accepted less than 0.5 s before the stream ended, when it has been quiet 0.4 s
    assert all(0.45 <= wait <= 1.5 for wait in waits[:15]), [round(w, 2) for w in waits]
    assert all(0.35 <= wait <= 1.5 for wait in waits[15:]), [round(w, 2) for w in waits]
    assert launched["job-0"] < accepted[-1]  # the first started while creations were still arriving


def test_launches_go_at_once_without_settling_and_on_close() -> None:
    launched, accepted = _launch_times(JobLaunchQueue(workers=2), ["a"], every=0)  # settle 0: the old behaviour
    assert launched["a"] - accepted[0] < 0.3
    waiting = JobLaunchQueue(workers=1, settle_seconds=30, max_delay_seconds=60)
    done = []
    waiting.submit("b", lambda: done.append(time.monotonic()), lambda e: None)
    closed = time.monotonic()
    waiting.close()  # a closing API launches what is queued instead of waiting out the burst
    deadline = time.monotonic() + 5
    while not done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done and done[0] - closed < 2
    with pytest.raises(ValueError):
        JobLaunchQueue(settle_seconds=-1, max_delay_seconds=1)


@pytest.mark.parametrize("value", ["nan", "-1", "soon"])
def test_launch_settings_refuse_what_is_not_a_duration(value: str) -> None:
    from trainguard.errors import ConfigError

    for key in ("TRAINGUARD_LAUNCH_SETTLE_SECONDS", "TRAINGUARD_LAUNCH_MAX_DELAY_SECONDS"):
        with pytest.raises(ConfigError, match=key):
            Settings.from_env({"TRAINGUARD_API_TOKEN": TOKEN, key: value})


def test_job_processes_run_with_the_configured_niceness(tmp_path: Path) -> None:
    import os

    from trainguard.services.launchers.base import ComponentSpec, JobLaunch

    launcher = LocalLauncher(tmp_path, niceness=7)
    command = ["python3", "-c", "import os, time; print('nice', os.nice(0), flush=True); time.sleep(0.2)"]
    launcher.start(JobLaunch(job_name="nice-job", components=(ComponentSpec(role="training", image="", command=command),)))
    deadline = time.monotonic() + 20
    log = tmp_path / "nice-job" / "training" / "output.log"
    while time.monotonic() < deadline and "nice" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    assert f"nice {os.nice(0) + 7}" in log.read_text(), log.read_text()
