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
