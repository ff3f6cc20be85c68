"""SageMaker's own LossNotDecreasing configuration through the SageMaker endpoint (issue 11):
silent on a healthy run whose mini-batch losses are noisy, IssuesFound at learning rate 100."""

from __future__ import annotations

import sys

import pytest

from tests.services.conftest import REPO, wait_for
from tests.services.test_sagemaker_endpoint import AWS_RULES_IMAGE, _request

SCRIPT = REPO / "tests" / "rules" / "reported_scripts" / "mlp_no_validation.py"
# the parameters the SageMaker SDK's rule_configs.loss_not_decreasing() sends
SDK_LOSS_NOT_DECREASING = {"rule_to_invoke": "LossNotDecreasing", "use_losses_collection": "True", "num_steps": "10",
                           "diff_percent": "0.1", "increase_threshold_percent": "5", "mode": "GLOBAL"}  # fmt: skip


def _rule_status(api, name: str, lr: str) -> dict:
    client = api.sagemaker()
    rules = [{"RuleConfigurationName": "LossNotDecreasing", "RuleEvaluatorImage": AWS_RULES_IMAGE,
              "RuleParameters": dict(SDK_LOSS_NOT_DECREASING)}]  # fmt: skip
    command = [sys.executable, str(SCRIPT), "--steps", "400", "--lr", lr]
    client.create_training_job(**_request(name, command, rules))

    def finished() -> dict | None:
        description = client.describe_training_job(TrainingJobName=name)
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        done = description["TrainingJobStatus"] != "InProgress" and statuses and statuses[0][
            "RuleEvaluationStatus"] not in ("InProgress", "Stopping")  # fmt: skip
        return description if done else None

    description = wait_for(finished, 180, f"job {name} and its rule to finish")
    return description["DebugRuleEvaluationStatuses"][0]


@pytest.mark.slow
def test_sagemaker_loss_not_decreasing_is_silent_on_noisy_healthy_training(api) -> None:
    status = _rule_status(api, "noisy-healthy", "0.05")
    assert status["RuleEvaluationStatus"] == "NoIssuesFound", status
    native = api.job("noisy-healthy")["rules"][0]
    assert native["last_evaluated_step"] >= 390 and not [f for f in native["findings"] if f.get("fired")]


@pytest.mark.slow
def test_sagemaker_loss_not_decreasing_finds_learning_rate_100(api) -> None:
    status = _rule_status(api, "lr-100", "100")
    assert status["RuleEvaluationStatus"] == "IssuesFound", status
