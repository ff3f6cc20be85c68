"""A rule that could not evaluate a job ends Error/RuleNotEvaluated in the service's API too."""

from __future__ import annotations

from tests.polling import wait_for
from tests.services.conftest import HOOK_EVERY_STEP, api_factory, training_command  # noqa: F401 - fixture

RULE = "tests.rules.rules_not_evaluated:NeedsAnUnsavedTensor"


def test_not_evaluated_is_error_with_details_in_the_api(api_factory) -> None:  # noqa: F811
    api = api_factory(TRAINGUARD_RULE_MODULES="tests.rules.rules_not_evaluated")
    spec = {"name": "not-evaluated", "hook_config": HOOK_EVERY_STEP,
            "command": training_command("--steps", "8"),
            "rules": [{"rule": RULE, "name": "Unsaved"}]}  # fmt: skip
    # Created by the key whose SageMaker client describes it below (a key sees its own jobs only).
    created = api.signed_request("POST", "/v1/jobs", spec)
    assert created[0] == 201, created
    job = wait_for(
        lambda: (j := api.job("not-evaluated"))["rules"][0]["status"] not in ("InProgress",) and j, 120, "the rule to end"
    )
    rule = job["rules"][0]
    assert rule["status"] == "Error", job
    assert rule["status_details"] == "RuleNotEvaluated: the tensor 'never_saved' is not in this run", job
    described = api.sagemaker().describe_training_job(TrainingJobName="not-evaluated")
    (status,) = described["DebugRuleEvaluationStatuses"]
    assert status["RuleEvaluationStatus"] == "Error"
    assert status["StatusDetails"].startswith("RuleNotEvaluated: ")
