"""A real restart of the API process (uvicorn subprocess, same database) while jobs run."""

from __future__ import annotations

import signal

import pytest

from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, training_command, wait_for

pytestmark = pytest.mark.slow


def _spec(name: str, steps: int, step_seconds: float) -> dict:
    return {
        "name": name,
        "command": training_command("--steps", str(steps), "--step-seconds", str(step_seconds)),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": CUSTOM_RULE, "name": "LossWatch", "parameters": {"threshold": 1000}}],
    }


def test_job_that_ends_while_the_api_is_down_is_known_after_restart(api) -> None:
    status, body = api.request("POST", "/v1/jobs", _spec("outlives-api", 30, 0.1))
    assert status == 201, body
    wait_for(
        lambda: api.job("outlives-api")["rules"][0]["last_evaluated_step"] is not None,
        60,
        "the rule to evaluate a step",
    )
    assert api.job("outlives-api")["secondary_status"] == "Training"
    api.kill(signal.SIGKILL)  # no shutdown code runs

    # Training finishes while no API is there; the rule runner evaluates to the end, then waits
    # with its reports in its outbox until an API acknowledges them (it never drops one).
    job_files = api.data_dir / "local" / "outlives-api"
    wait_for(lambda: (job_files / "training" / "exit_code").exists(), 60, "training to end")
    wait_for(lambda: "finished: NoIssuesFound" in (job_files / "rule--LossWatch" / "output.log").read_text(), 60,
             "the rule runner to finish evaluating")  # fmt: skip
    assert not (job_files / "rule--LossWatch" / "exit_code").exists()

    api.start()
    job = wait_for(
        lambda: (j := api.job("outlives-api"))["status"] == "Completed"
        and j["rules"][0]["status"] != "InProgress"
        and all(c["state"] == "Exited" for c in j["components"])  # the runner exits once its outbox is empty
        and j,
        30, "the restarted API to pick up the ends",
    )  # fmt: skip
    assert job["rules"][0]["status"] == "NoIssuesFound", job["rules"][0]["status_details"]
    assert job["exit_code"] == 0
    assert [t["status"] for t in job["secondary_status_transitions"]] == [
        "Starting",
        "Training",
        "Uploading",
        "Completed",
    ]
    assert {c["role"]: (c["state"], c["exit_code"]) for c in job["components"]} == {
        "training": ("Exited", 0),
        "rule:LossWatch": ("Exited", 0),
    }
    assert "step 29" in api.request("GET", "/v1/jobs/outlives-api/logs?component=training")[1]


def test_restarted_api_follows_and_stops_a_running_job(api) -> None:
    status, body = api.request("POST", "/v1/jobs", _spec("followed", 600, 0.05))
    assert status == 201, body
    wait_for(lambda: api.job("followed")["secondary_status"] == "Training", 30, "training to start")
    api.kill(signal.SIGTERM)
    api.start()
    # The new process reports from the same rows and the launcher's files, and can still act.
    wait_for(
        lambda: api.job("followed")["rules"][0]["last_evaluated_step"] is not None, 60, "rule reports to the new API"
    )
    first_step = api.job("followed")["rules"][0]["last_evaluated_step"]
    wait_for(lambda: api.job("followed")["rules"][0]["last_evaluated_step"] > first_step, 30, "more reports")
    status, body = api.request("POST", "/v1/jobs/followed/stop?grace_seconds=5", {})
    assert status == 202 and body["stopping"] is True
    job = wait_for(
        lambda: (j := api.job("followed"))["status"] == "Stopped" and j["rules"][0]["status"] == "Stopped" and j,
        60,
        "the stop",
    )
    assert job["secondary_status"] == "Stopped"
    assert job["stop_cause"] == "stopped by request"
    training = {c["role"]: c for c in job["components"]}["training"]
    assert training["state"] == "Exited" and training["exit_code"] != 0


def test_runner_token_is_scoped_to_its_job_reports(api) -> None:
    import json

    for name in ("scoped-a", "scoped-b"):
        status, body = api.request("POST", "/v1/jobs", _spec(name, 400, 0.05))
        assert status == 201, body
    spec_file = api.data_dir / "local" / "scoped-a" / "rule--LossWatch" / "spec.json"
    wait_for(spec_file.exists, 30, "the rule component")
    runner_token = json.loads(spec_file.read_text())["environment"]["TRAINGUARD_API_TOKEN"]
    assert runner_token != api.token
    report = {"configuration_name": "LossWatch", "status": "InProgress", "last_evaluated_step": 0}
    own, other = "/v1/internal/jobs/scoped-a/rules/LossWatch/status", "/v1/internal/jobs/scoped-b/rules/LossWatch/status"
    assert api.request("POST", own, report, token=runner_token)[0] == 200
    assert api.request("POST", other, report, token=runner_token)[0] == 401
    assert api.request("GET", "/v1/jobs", token=runner_token)[0] == 401
    assert api.request("POST", "/v1/jobs/scoped-b/stop", {}, token=runner_token)[0] == 401
    for name in ("scoped-a", "scoped-b"):
        assert api.request("POST", f"/v1/jobs/{name}/stop?grace_seconds=2", {})[0] == 202
    wait_for(lambda: all(api.job(n)["status"] == "Stopped" for n in ("scoped-a", "scoped-b")), 60, "both stops")
