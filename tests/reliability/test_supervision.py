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
from tests.reliability.faults import RestartableS3, local_run_files, s3_run_files, uploader_command
from tests.s3_server import DUMMY_CREDENTIALS, free_port
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
