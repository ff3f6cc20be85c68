"""SageMaker's own LossNotDecreasing configuration through the SageMaker endpoint (issue 11):
silent on a healthy run whose mini-batch losses are noisy, IssuesFound at learning rate 100."""

from __future__ import annotations

import sys

import pytest

from tests.services.conftest import REPO, wait_for
from tests.services.test_sagemaker_endpoint import AWS_RULES_IMAGE, _request, _sdk_action_json

SCRIPT = REPO / "tests" / "rules" / "reported_scripts" / "mlp_no_validation.py"
# the parameters the SageMaker SDK's rule_configs.loss_not_decreasing() sends
SDK_LOSS_NOT_DECREASING = {"rule_to_invoke": "LossNotDecreasing", "use_losses_collection": "True", "num_steps": "10",
                           "diff_percent": "0.1", "increase_threshold_percent": "5", "mode": "GLOBAL"}  # fmt: skip


def _finished_job(api, name: str, lr: str, steps: int = 400) -> dict:
    """The job's description once it and its rule ended; the rule's actions stop the job (as the
    SDK's Rule.sagemaker(..., actions=rule_configs.StopTraining()) sends them)."""
    client = api.sagemaker()
    parameters = {**SDK_LOSS_NOT_DECREASING, "action_json": _sdk_action_json(name)}
    rules = [{"RuleConfigurationName": "LossNotDecreasing", "RuleEvaluatorImage": AWS_RULES_IMAGE,
              "RuleParameters": parameters}]  # fmt: skip
    command = [sys.executable, str(SCRIPT), "--steps", str(steps), "--lr", lr]
    client.create_training_job(**_request(name, command, rules))

    def finished() -> dict | None:
        description = client.describe_training_job(TrainingJobName=name)
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        done = description["TrainingJobStatus"] in ("Completed", "Failed", "Stopped") and statuses and statuses[0][
            "RuleEvaluationStatus"] not in ("InProgress", "Stopping")  # fmt: skip
        return description if done else None

    return wait_for(finished, 180, f"job {name} and its rule to finish")


@pytest.mark.slow
def test_sagemaker_loss_not_decreasing_is_silent_on_noisy_healthy_training(api) -> None:
    description = _finished_job(api, "noisy-healthy", "0.05")
    status = description["DebugRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "NoIssuesFound", status
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    native = api.job("noisy-healthy")["rules"][0]
    assert native["last_evaluated_step"] >= 390 and not [f for f in native["findings"] if f.get("fired")]


@pytest.mark.slow
def test_sagemaker_loss_not_decreasing_stops_learning_rate_100(api) -> None:
    description = _finished_job(api, "lr-100", "100", steps=20000)
    status = description["DebugRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "IssuesFound", status
    assert description["TrainingJobStatus"] == "Stopped", description["TrainingJobStatus"]
    log = api.request("GET", "/v1/jobs/lr-100/logs?component=training")[1]
    assert "step 19900" not in log  # stopped long before its 20,000 steps
