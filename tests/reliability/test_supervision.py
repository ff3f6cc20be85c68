"""Supervision through the real control API (local launcher): a kill -9'd uploader is restarted and
resumes, an uploader that cannot work fails the job while training still runs, and a job that
captures nothing still ends with its rules ended.

The local launcher plans no uploader (local rules read the run directory), so the test adds one
to the job the way the Docker plan does: a component with role ``uploader`` started through the
same launcher files the API follows; from then on the API's reconciler supervises it.
"""

from __future__ import annotations

import os
import sqlite3
import signal
import time
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.reliability.faults import (
    RestartableS3,
    local_run_files,
    s3_run_files,
    uploader_command,
    wait_for_capture,
)
from tests.s3_server import DUMMY_CREDENTIALS, free_port, s3_client
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, training_command
from trainguard.format.layout import END_OF_TRAINING
from trainguard.services.launchers.base import ComponentSpec, JobLaunch
from trainguard.services.launchers.local import LocalLauncher

RULE_FINAL = {"NoIssuesFound", "IssuesFound", "Error", "Stopped"}


def _add_uploader(api, job: str, endpoint: str, *extra: str) -> Path:  # noqa: ANN001
    run = api.data_dir / "jobs" / job / "debug-output"
    command = uploader_command(run, f"s3://runs/{job}/debug-output", endpoint, *extra)
    launcher = LocalLauncher(api.data_dir / "local")
    launcher.start(JobLaunch(job, (ComponentSpec("uploader", "", tuple(command), dict(DUMMY_CREDENTIALS)),)))
    return api.data_dir / "local" / job / "uploader"


def _command_pid(component_dir: Path) -> int:
    """The uploader process itself (the launcher's wrapper is its parent)."""
    wrapper = int((component_dir / "pid").read_text().split()[0])
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    return int(children[0])


def test_killed_uploader_is_restarted_and_every_file_reaches_s3(api_factory, tmp_path: Path) -> None:
    s3 = RestartableS3(tmp_path / "moto.log")
    s3.start()
    try:
        s3.client().create_bucket(Bucket="runs")
        api = api_factory()
        spec = {"name": "kill-uploader", "hook_config": HOOK_EVERY_STEP,
                "command": training_command("--steps", "300", "--step-seconds", "0.05")}  # fmt: skip
        assert api.request("POST", "/v1/jobs", spec)[0] == 201
        component = _add_uploader(api, "kill-uploader", s3.endpoint)
        wait_for_capture(api.data_dir / "jobs" / "kill-uploader" / "debug-output")
        wait_for(lambda: len(s3_run_files(s3.client(), "runs", "kill-uploader/debug-output")) >= 10, 60, "uploads")
        os.kill(_command_pid(component), signal.SIGKILL)
        wait_for(lambda: "restarting uploader" in (component / "output.log").read_text(), 20, "the restart")
        job = wait_for(lambda: (j := api.job("kill-uploader"))["status"] != "InProgress" and j, 120, "the job to end")
        assert job["status"] == "Completed", job
        local = local_run_files(api.data_dir / "jobs" / "kill-uploader" / "debug-output")
        on_s3 = s3_run_files(s3.client(), "runs", "kill-uploader/debug-output")
        assert END_OF_TRAINING in local and on_s3 == local, sorted(set(local) - set(on_s3))
    finally:
        s3.kill()


def test_uploader_that_cannot_upload_fails_the_job_while_training_runs(api_factory) -> None:
    api = api_factory()
    spec = {"name": "no-s3", "hook_config": HOOK_EVERY_STEP,
            "command": training_command("--steps", "600", "--step-seconds", "0.05")}  # 30 s of training
    started = time.monotonic()
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    _add_uploader(api, "no-s3", f"http://127.0.0.1:{free_port()}", "--give-up-after", "3")  # nothing listens there
    job = wait_for(lambda: (j := api.job("no-s3"))["status"] != "InProgress" and j, 60, "the job to fail")
    assert time.monotonic() - started < 25  # well before training would have ended
    assert job["status"] == "Failed", job
    assert "uploader failed (exit code 1)" in job["failure_reason"] and "S3 kept failing" in job["failure_reason"]


def test_job_capturing_nothing_completes_and_its_rules_end(api) -> None:  # noqa: ANN001
    spec = {"name": "captures-nothing", "command": ["python", "-c", "print('no model here')"],
            "rules": [{"rule": CUSTOM_RULE, "name": "LossBlowup", "parameters": {"threshold": 1000}}]}  # fmt: skip
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    # The reconciler writes the missing end marker; the rule must then end with an Error that says
    # it could not evaluate anything, never NoIssuesFound, and never sit InProgress.
    job = wait_for(
        lambda: (j := api.job("captures-nothing"))["rules"][0]["status"] in RULE_FINAL and j, 60, "the rule to end"
    )
    assert job["status"] == "Completed", job
    assert job["rules"][0]["status"] == "Error", job["rules"][0]
    assert job["rules"][0]["status_details"].startswith("RuleNotEvaluated: training ended without capturing"), job
    assert (api.data_dir / "jobs" / "captures-nothing" / "debug-output" / END_OF_TRAINING).exists()


def test_killed_rule_runner_is_restarted_and_resumes(api) -> None:  # noqa: ANN001
    spec = {"name": "kill-runner", "hook_config": HOOK_EVERY_STEP,
            "command": training_command("--steps", "300", "--step-seconds", "0.05"),
            "rules": [{"rule": CUSTOM_RULE, "name": "Loss", "parameters": {"threshold": 1e30}}]}  # fmt: skip
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    wait_for(lambda: (api.job("kill-runner")["rules"][0].get("last_evaluated_step") or -1) >= 5, 90, "evaluations")
    component = api.data_dir / "local" / "kill-runner" / "rule--Loss"
    os.kill(_command_pid(component), signal.SIGKILL)
    wait_for(lambda: "restarting rule:Loss" in (component / "output.log").read_text(), 20, "the restart")
    job = wait_for(
        lambda: (j := api.job("kill-runner"))["rules"][0]["status"] in RULE_FINAL and j["status"] != "InProgress" and j,
        120, "the rule and the job to end",
    )  # fmt: skip
    assert job["status"] == "Completed" and job["rules"][0]["status"] == "NoIssuesFound", job
    assert job["rules"][0]["last_evaluated_step"] == 299
    with sqlite3.connect(api.data_dir / "trainguard.db") as db:
        steps = {row[0] for row in db.execute("SELECT step FROM metric_data WHERE job_name='kill-runner'")}
    assert steps == set(range(300))  # every step evaluated and reported, across the kill


def test_uploader_told_to_finish_is_not_killed_by_the_stop_grace(api_factory, tmp_path: Path) -> None:
    """Telling an uploader that training ended (SIGTERM) is no stop: its last pass may outlast the
    job's stop grace (S3 slow, or emptied and being refilled) and must not be SIGKILLed for it.
    On the compose stack (bench/chaos_stack.py, restart-s3-empty under load) such an uploader died
    6 times (exit 137) and a job with every file on S3 ended Failed. Here the grace is 1 s and the
    S3 endpoint is paused (SIGSTOP) from the end of training until well after the uploader was told."""
    s3 = RestartableS3(tmp_path / "moto.log")
    s3.start()
    try:
        s3.client().create_bucket(Bucket="runs")
        api = api_factory(TRAINGUARD_STOP_GRACE_SECONDS="1")
        spec = {"name": "slow-finish", "hook_config": HOOK_EVERY_STEP,
                "command": training_command("--steps", "100", "--step-seconds", "0.05")}  # fmt: skip
        assert api.request("POST", "/v1/jobs", spec)[0] == 201
        component = _add_uploader(api, "slow-finish", s3.endpoint)
        wait_for_capture(api.data_dir / "jobs" / "slow-finish" / "debug-output")
        wait_for(lambda: len(s3_run_files(s3.client(), "runs", "slow-finish/debug-output")) >= 10, 60, "uploads")
        # Paused mid-run: the uploader cannot put the end marker, so it is still at work when
        # training has ended; the reconciler tells it to finish 5 s later, and its last pass waits
        # on S3 for longer than the 1 s grace.
        s3.process.send_signal(signal.SIGSTOP)
        try:
            told = "telling its uploader to finish"
            wait_for(lambda: told in api.log_path.read_text(errors="replace"), 90, "the uploader to be told")
            time.sleep(4)
        finally:
            s3.process.send_signal(signal.SIGCONT)
        job = wait_for(lambda: (j := api.job("slow-finish"))["status"] != "InProgress" and j, 120, "the job to end")
        assert job["status"] == "Completed", job
        assert "restarting uploader" not in (component / "output.log").read_text(), "the uploader was killed"
        local = local_run_files(api.data_dir / "jobs" / "slow-finish" / "debug-output")
        on_s3 = s3_run_files(s3.client(), "runs", "slow-finish/debug-output")
        assert END_OF_TRAINING in on_s3 and on_s3 == local, sorted(set(local) - set(on_s3))
    finally:
        s3.kill()


def test_reconciler_reads_the_real_uploaders_status_file(tmp_path: Path, s3_endpoint: str) -> None:
    """The reconciler's view of a real uploader through the local launcher and its status file: not
    ready before it follows, ready once it does; told that training ended and stopped with exit 143
    (as Ray reports every stopped job), finished only by its own clean "stopped"; after a restart,
    the dead attempt's document says nothing about the new uploader."""
    from types import SimpleNamespace

    from trainguard.services.api.reconciler import Reconciler
    from trainguard.services.launchers.base import ComponentState, ComponentStatus

    s3 = s3_client(s3_endpoint)
    s3.create_bucket(Bucket="status")
    run = tmp_path / "jobs" / "job" / "debug-output"  # the local plan's source: the reconciler's path
    (run / "events").mkdir(parents=True)
    (run / "events" / "000000000000_worker_0.tfevents").write_bytes(b"x" * 64)
    launcher = LocalLauncher(tmp_path / "local")
    service = SimpleNamespace(launcher=launcher, settings=SimpleNamespace(data_dir=tmp_path))
    reconciler = Reconciler(service, interval=1.0)  # type: ignore[arg-type]
    as_ray_says = ComponentStatus("uploader", ComponentState.EXITED, 143, "stopped through Ray (SIGTERM)")
    command = uploader_command(run, "s3://status/job/debug-output", s3_endpoint, "--drain", "0.2")
    assert not reconciler._uploader_ready("job", ended_for=10.0)  # no status yet: not told
    launcher.start(JobLaunch("job", (ComponentSpec("uploader", "", tuple(command), dict(DUMMY_CREDENTIALS)),)))
    try:
        wait_for(lambda: reconciler._uploader_ready("job", ended_for=10.0), 60, "the uploader to say it follows")
        reconciler._uploader_told.add("job")
        assert reconciler._as_finished_if_it_finished("job", as_ray_says) is as_ray_says  # still at work
        launcher.stop("job", ("uploader",), grace_seconds=60)
        wait_for(lambda: launcher.status("job")["uploader"].state is ComponentState.EXITED, 60, "it to finish")
        assert launcher.status("job")["uploader"].exit_code == 0
        finished = reconciler._as_finished_if_it_finished("job", as_ray_says)
        assert (finished.state, finished.exit_code) == (ComponentState.EXITED, 0), finished
        assert END_OF_TRAINING in s3_run_files(s3, "status", "job/debug-output")

        dead = reconciler._uploader_status("job")
        assert dead is not None and dead.state == "stopped"
        killed = ComponentStatus("uploader", ComponentState.EXITED, 137, "killed by SIGKILL")
        assert reconciler._supervise_uploader("job", killed) == ""  # restarted through the launcher
        assert reconciler._replaced_uploader["job"] == dead.attempt
        reconciler._uploader_told.add("job")
        deadline = time.monotonic() + 60
        while (status := reconciler._uploader_status("job")) is None:
            assert time.monotonic() < deadline, "the restarted uploader never wrote its status"
            # The file still holds the dead attempt's "stopped": not the restarted uploader's word.
            assert reconciler._as_finished_if_it_finished("job", as_ray_says) is as_ray_says
            assert not reconciler._uploader_ready("job", ended_for=10.0)
            time.sleep(0.05)
        assert status.attempt != dead.attempt and status.ready
    finally:
        launcher.stop("job", grace_seconds=5)
