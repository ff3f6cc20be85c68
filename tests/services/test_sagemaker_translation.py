"""CreateTrainingJob request -> job spec: the SDK's quirks (pure translation, nothing launched)."""

from __future__ import annotations

import pytest
from trainguard.services.api.sagemaker import SageMakerError, job_spec_from_request
from trainguard.services.sagemaker_container.contract import CONTRACT_ENV, JobContract

from tests.services.conftest import CUSTOM_RULE

RULES_IMAGE = "895741380848.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rules:latest"


def _request(**extra) -> dict:
    return {"TrainingJobName": "t", "AlgorithmSpecification": {"TrainingImage": "img", "ContainerEntrypoint": ["python"],
            "ContainerArguments": ["train.py", "--epochs", "2"]}, **extra}  # fmt: skip


def test_command_environment_and_hyperparameters() -> None:
    spec, unavailable, _ = job_spec_from_request(
        _request(Environment={"A": "1"}, HyperParameters={"learning-rate": "0.1"}, StoppingCondition={"MaxRuntimeInSeconds": 60})
    )
    # Every SageMaker job runs through the container-contract runner, which gets the request's
    # entry point, hyperparameters and channels as the contract (SM_HP_* are set job-side).
    assert spec.command == ["python", "-m", "trainguard.services.sagemaker_container"] and spec.image == "img"
    contract = JobContract.from_json(spec.environment[CONTRACT_ENV])
    assert contract.command == ("python", "train.py", "--epochs", "2")
    assert contract.hyperparameters == {"learning-rate": "0.1"} and spec.environment["A"] == "1"
    assert spec.stopping_condition.max_runtime_seconds == 60 and unavailable == []


def test_rule_parameters_as_the_sdk_sends_them() -> None:
    rules = [
        {"RuleConfigurationName": "Similar", "RuleEvaluatorImage": RULES_IMAGE,
         "RuleParameters": {"rule_to_invoke": "SimilarAcrossRuns", "other_trial_1": "/runs/b", "other_trial_0": "/runs/a"}},
        {"RuleConfigurationName": "Mine", "RuleEvaluatorImage": RULES_IMAGE,
         "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "5", "start_step": "2",
                            "action_json": '[{\\"name\\": \\"StopTraining\\", \\"training_job_prefix\\": \\"t\\"}]'}},
    ]  # fmt: skip
    if "SimilarAcrossRuns" not in __import__("trainguard.rules", fromlist=["rule_names"]).rule_names():
        pytest.skip("the built-in rules are not installed in this checkout")
    spec = job_spec_from_request(_request(DebugRuleConfigurations=rules))[0]
    similar, mine = spec.rules
    assert (similar.rule, similar.parameters) == ("SimilarAcrossRuns", {"other_trials": "/runs/a,/runs/b"})
    assert mine.parameters == {"threshold": "5", "start_step": "2"}
    assert mine.actions == [{"name": "stoptraining", "training_job_prefix": "t"}]


def test_errors_name_the_request_member() -> None:
    with pytest.raises(SageMakerError) as bad_name:
        job_spec_from_request({**_request(), "TrainingJobName": "bad_name"})
    assert bad_name.value.code == "ValidationException" and bad_name.value.message.startswith("TrainingJobName:")
    bad_action = [{"RuleConfigurationName": "X", "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "action_json": "[{oops"}}]
    with pytest.raises(SageMakerError, match=r"DebugRuleConfigurations\[0\].RuleParameters.action_json"):
        job_spec_from_request(_request(DebugRuleConfigurations=bad_action))
    bad_hook = {"S3OutputPath": "s3://b/", "HookParameters": {"save_intervall": "1"}}
    with pytest.raises(SageMakerError, match="DebugHookConfig: unknown key 'save_intervall'"):
        job_spec_from_request(_request(DebugHookConfig=bad_hook))
