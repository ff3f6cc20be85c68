"""Advice on the service: a property of the data is NoIssuesFound with ``Advice:`` details on the
SageMaker endpoint, advice in the native API, and neither an alarm nor a stop (real API, real
rule runner, real training, boto3's sagemaker client)."""

from __future__ import annotations

import pytest

from tests.services.conftest import training_command, wait_for
from tests.services.test_sagemaker_endpoint import _request, _sdk_action_json

AWS_RULES_IMAGE = "895741380848.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rules:latest"


@pytest.mark.slow
def test_advice_is_no_issues_found_with_advice_details_and_stops_nothing(api) -> None:
    client = api.sagemaker()
    name = "advised-job"
    # The script's inputs are N(0, 1) samples: any channel mean is above 1e-6, so NotNormalizedData
    # reports the inputs' centring, which is advice; with a stoptraining action, on a run that learns.
    rules = [
        {"RuleConfigurationName": "Inputs", "RuleEvaluatorImage": AWS_RULES_IMAGE,
         "RuleParameters": {"rule_to_invoke": "NotNormalizedData", "threshold_mean": "0.000001",
                            "threshold_samples": "32", "action_json": _sdk_action_json(name)}},
    ]  # fmt: skip
    request = _request(name, training_command("--steps", "12"), rules)
    request["DebugHookConfig"]["CollectionConfigurations"].append({"CollectionName": "model_inputs"})
    client.create_training_job(**request)

    def finished() -> dict | None:
        description = client.describe_training_job(TrainingJobName=name)
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        done = description["TrainingJobStatus"] != "InProgress" and statuses[0]["RuleEvaluationStatus"] != "InProgress"
        return description if done else None

    description = wait_for(finished, 120, "the job and its rule to finish")
    assert description["TrainingJobStatus"] == "Completed"
    status = description["DebugRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "NoIssuesFound", status.get("StatusDetails")
    assert status["StatusDetails"].startswith("Advice: NotNormalizedData at step "), status
    native = api.job(name)
    (rule,) = native["rules"]
    assert rule["status"] == "NoIssuesFound" and rule["advice"] is True
    assert rule["findings"] and all(f["advice"] is True and f["certain"] is False for f in rule["findings"])
    # no alarm went off, so no action ran
    assert native["actions"] == [], native["actions"]
    assert all(alarm["state"] != "ALARM" for alarm in native["alarms"]), native["alarms"]


def test_a_reported_advice_raises_no_alarm_and_an_issue_does(tmp_path) -> None:
    import sys

    pytest.importorskip("httpx", reason="TestClient needs httpx")
    from fastapi.testclient import TestClient
    from trainguard.services.api.app import create_app
    from trainguard.services.api.settings import Settings

    from tests.services.conftest import CUSTOM_RULE, TOKEN

    auth = {"Authorization": f"Bearer {TOKEN}"}
    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RULE_MODULES": "tests.services.rules_for_tests"}
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        rule = {"rule": CUSTOM_RULE, "name": "R", "actions": [{"name": "webhook", "url": "http://127.0.0.1:9/x"}]}
        spec = {"name": "reported", "command": [sys.executable, "-c", "import time; time.sleep(60)"], "rules": [rule]}
        assert client.post("/v1/jobs", headers=auth, json=spec).status_code == 201
        route = "/v1/internal/jobs/reported/rules/R/status"
        try:
            finding = {"rule": "LossAboveThreshold", "step": 3, "fired": True, "message": "inputs not centred",
                       "certain": False, "advice": True}  # fmt: skip
            report = {"configuration_name": "R", "status": "InProgress", "result": finding}
            assert client.post(route, headers=auth, json=report).status_code == 200
            job = client.get("/v1/jobs/reported", headers=auth).json()
            assert job["rules"][0]["findings"][0]["advice"] is True and job["rules"][0]["advice"] is True
            assert [alarm["state"] for alarm in job["alarms"]] != ["ALARM"] and job["actions"] == []
            issue = {**finding, "step": 4, "advice": False, "message": "loss 1e9"}
            assert client.post(route, headers=auth, json={**report, "result": issue}).status_code == 200
            job = client.get("/v1/jobs/reported", headers=auth).json()
            assert [alarm["state"] for alarm in job["alarms"]] == ["ALARM"] and job["rules"][0]["advice"] is False
        finally:
            client.post("/v1/jobs/reported/stop?grace_seconds=0", headers=auth)
