"""The SageMaker-compatible endpoint driven by the real boto3 ``sagemaker`` client."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from tests.services.conftest import CUSTOM_RULE, REPO, training_command, wait_for

AWS_RULES_IMAGE = "895741380848.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rules:latest"
AWS_EVALUATOR_IMAGE = "759209512951.dkr.ecr.us-west-2.amazonaws.com/sagemaker-debugger-rule-evaluator:latest"


def _request(name: str, command: list[str], rules: list[dict], **extra) -> dict:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "AlgorithmSpecification": {"TrainingImage": "trainguard-training:local", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": command[:1], "ContainerArguments": command[1:]},
        # The SDK's quirk: the same collection twice with different parameters.
        "DebugHookConfig": {"S3OutputPath": "s3://bkt/", "HookParameters": {"save_interval": "1"},
                            "CollectionConfigurations": [{"CollectionName": "losses"},
                                                         {"CollectionName": "losses", "CollectionParameters": {"save_interval": "1"}}]},
        "DebugRuleConfigurations": rules,
        "ProfilerConfig": {"S3OutputPath": "s3://bkt/", "DisableProfiler": True},
        **extra,
    }  # fmt: skip


def _sdk_action_json(prefix: str) -> str:
    """action_json exactly as the SDK's ActionList.serialize() builds it: literal backslashes before quotes."""
    return '[{\\"name\\": \\"stoptraining\\", \\"training_job_prefix\\": \\"' + prefix + '\\"}]'


@pytest.mark.slow
def test_faulty_job_is_found_by_its_rule_and_stopped(api, s3_endpoint) -> None:
    api.kill()
    api.environment["CLOUDWATCH_ENDPOINT_URL"] = s3_endpoint  # moto's server also speaks CloudWatch
    api.start()
    client = api.sagemaker()
    name = "faulty-job"
    rules = [
        {"RuleConfigurationName": "LossBlowup", "RuleEvaluatorImage": AWS_EVALUATOR_IMAGE,
         "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "1000.0", "action_json": _sdk_action_json(name)}},
    ]  # fmt: skip
    arn = client.create_training_job(
        **_request(name, training_command("--steps", "400", "--blowup-at", "5", "--step-seconds", "0.05"), rules)
    )
    assert arn["TrainingJobArn"].endswith(f":training-job/{name}")

    def stopped() -> dict | None:
        description = client.describe_training_job(TrainingJobName=name)
        return description if description["TrainingJobStatus"] == "Stopped" else None

    description = wait_for(stopped, 90, "the faulty job to be Stopped")
    status = description["DebugRuleEvaluationStatuses"][0]
    assert status["RuleConfigurationName"] == "LossBlowup"
    assert status["RuleEvaluationStatus"] == "IssuesFound"
    assert status["StatusDetails"].startswith(
        "RuleEvaluationConditionMet: Evaluation of the rule LossAboveThreshold at step "
    )
    assert ":processing-job/" in status["RuleEvaluationJobArn"]
    assert description["SecondaryStatus"] == "Stopped"
    transitions = [t["Status"] for t in description["SecondaryStatusTransitions"]]
    assert transitions[:2] == ["Starting", "Training"] and transitions[-2:] == ["Stopping", "Stopped"]
    assert description["TrainingEndTime"] >= description["TrainingStartTime"]
    # The training stopped long before its 400 steps (20 s) were done.
    log = api.request("GET", f"/v1/jobs/{name}/logs?component=training")[1]
    assert "step 399" not in log
    native = api.job(name)
    assert native["rules"][0]["findings"][0]["fired"] is True
    assert native["rules"][0]["fix_hint"] == "The loss blew up: lower the learning rate or clip gradients."
    assert any(a["action"] == "stoptraining" and a["status"] == "Succeeded" for a in native["actions"])
    # The rule runner's metrics reached CloudWatch (namespace and dimensions as documented).
    import boto3

    cloudwatch = boto3.client("cloudwatch", endpoint_url=s3_endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
    metrics = cloudwatch.list_metrics(Namespace="trainguard/Rules", MetricName="RuleIssuesFound")["Metrics"]
    dimensions = [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in metrics]
    assert {"TrainingJobName": name, "RuleConfigurationName": "LossBlowup"} in dimensions


@pytest.mark.slow
def test_healthy_job_completes_with_no_issues(api) -> None:
    client = api.sagemaker()
    rules = [
        {"RuleConfigurationName": "LossBlowup", "RuleEvaluatorImage": AWS_RULES_IMAGE,
         "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "1000.0", "action_json": _sdk_action_json("healthy-job")}},
    ]  # fmt: skip
    client.create_training_job(**_request("healthy-job", training_command("--steps", "6"), rules))

    def finished() -> dict | None:
        description = client.describe_training_job(TrainingJobName="healthy-job")
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        done = description["TrainingJobStatus"] == "Completed" and statuses[0]["RuleEvaluationStatus"] != "InProgress"
        return description if done else None

    description = wait_for(finished, 90, "the healthy job and its rule to finish")
    assert description["DebugRuleEvaluationStatuses"][0]["RuleEvaluationStatus"] == "NoIssuesFound"
    assert [t["Status"] for t in description["SecondaryStatusTransitions"]] == [
        "Starting",
        "Training",
        "Uploading",
        "Completed",
    ]
    assert description["DebugRuleConfigurations"][0]["RuleParameters"]["rule_to_invoke"] == CUSTOM_RULE
    assert "FailureReason" not in description
    summaries = client.list_training_jobs(NameContains="healthy", StatusEquals="Completed")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in summaries] == ["healthy-job"]
    # The rule's findings file is where the report expects it (SageMaker's job layout).
    output = api.data_dir / "jobs" / "healthy-job" / "rule-output" / "LossBlowup.json"
    assert json.loads(output.read_text())["status"] == "NoIssuesFound"


def test_failed_job_reports_exit_code_and_reason(api) -> None:
    client = api.sagemaker()
    client.create_training_job(**_request("failing-job", training_command("--steps", "2", "--exit-code", "3"), []))

    def failed() -> dict | None:
        description = client.describe_training_job(TrainingJobName="failing-job")
        return description if description["TrainingJobStatus"] == "Failed" else None

    description = wait_for(failed, 60, "the job to fail")
    assert description["FailureReason"].startswith("AlgorithmError: training exited with code 3")
    assert description["SecondaryStatus"] == "Failed"


def test_an_ended_job_reports_its_training_seconds_and_refuses_a_stop(api) -> None:
    """As AWS: TrainingTimeInSeconds and BillableTimeInSeconds once the job ended; StopTrainingJob
    on an ended job is a ValidationException naming its status (a Stopping one is a no-op)."""
    client = api.sagemaker()
    client.create_training_job(**_request("short-job", ["sh", "-c", "sleep 2"], []))
    running = wait_for(lambda: (d := client.describe_training_job(TrainingJobName="short-job"))
                       .get("TrainingStartTime") and d, 60, "the job to start")  # fmt: skip
    if running["TrainingJobStatus"] == "InProgress":
        assert "TrainingTimeInSeconds" not in running and "BillableTimeInSeconds" not in running
    ended = wait_for(lambda: (d := client.describe_training_job(TrainingJobName="short-job"))
                     ["TrainingJobStatus"] == "Completed" and d, 60, "the job to complete")  # fmt: skip
    seconds = (ended["TrainingEndTime"] - ended["TrainingStartTime"]).total_seconds()
    assert isinstance(ended["TrainingTimeInSeconds"], int) and ended["TrainingTimeInSeconds"] == round(seconds)
    assert ended["BillableTimeInSeconds"] == ended["TrainingTimeInSeconds"] >= 2
    with pytest.raises(ClientError) as refused:
        client.stop_training_job(TrainingJobName="short-job")
    error = refused.value.response["Error"]
    assert (error["Code"], refused.value.response["ResponseMetadata"]["HTTPStatusCode"]) == ("ValidationException", 400)
    assert error["Message"] == "The request was rejected because the training job is in status Completed."
    assert client.describe_training_job(TrainingJobName="short-job")["TrainingJobStatus"] == "Completed"

    # Ends 2 s after its SIGTERM, so the second stop below finds it Stopping.
    client.create_training_job(**_request("long-job", ["sh", "-c", "trap 'sleep 2; exit 0' TERM; sleep 60 & wait"], []))
    wait_for(lambda: client.describe_training_job(TrainingJobName="long-job").get("TrainingStartTime"), 60,
             "the long job to start")  # fmt: skip
    client.stop_training_job(TrainingJobName="long-job")
    client.stop_training_job(TrainingJobName="long-job")  # Stopping: a no-op, as on AWS
    wait_for(lambda: client.describe_training_job(TrainingJobName="long-job")["TrainingJobStatus"] == "Stopped", 60,
             "the long job to stop")  # fmt: skip
    with pytest.raises(ClientError, match="in status Stopped"):
        client.stop_training_job(TrainingJobName="long-job")


def test_a_job_stopped_before_its_launch_stops(api) -> None:
    """StopTrainingJob right after CreateTrainingJob arrives before the launch queue starts the job:
    the stop must still reach the processes once they are started."""
    client = api.sagemaker()
    client.create_training_job(**_request("stopped-at-once", ["sh", "-c", "exec sleep 60"], []))
    client.stop_training_job(TrainingJobName="stopped-at-once")
    wait_for(lambda: client.describe_training_job(TrainingJobName="stopped-at-once")["TrainingJobStatus"] == "Stopped",
             45, "the job stopped before its launch to be Stopped")  # fmt: skip


def test_errors_have_sagemaker_shapes(api) -> None:
    client = api.sagemaker()
    with pytest.raises(ClientError) as missing:
        client.describe_training_job(TrainingJobName="no-such-job")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFound"
    with pytest.raises(ClientError) as stop_missing:
        client.stop_training_job(TrainingJobName="no-such-job")
    assert stop_missing.value.response["Error"]["Code"] == "ResourceNotFound"

    bad_rule = [
        {
            "RuleConfigurationName": "X",
            "RuleEvaluatorImage": AWS_RULES_IMAGE,
            "RuleParameters": {"rule_to_invoke": "NoSuchRule"},
        }
    ]
    with pytest.raises(ClientError) as invalid:
        client.create_training_job(**_request("bad-rule", training_command(), bad_rule))
    error = invalid.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert "DebugRuleConfigurations[0]" in error["Message"] and "NoSuchRule" in error["Message"]
    assert "A custom rule is given as" in error["Message"]

    bad_parameter = [{"RuleConfigurationName": "X", "RuleEvaluatorImage": AWS_RULES_IMAGE,
                      "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "high"}}]  # fmt: skip
    with pytest.raises(ClientError) as invalid_parameter:
        client.create_training_job(**_request("bad-param", training_command(), bad_parameter))
    assert "threshold" in invalid_parameter.value.response["Error"]["Message"]

    client.create_training_job(**_request("twice", training_command("--steps", "1"), []))
    with pytest.raises(ClientError) as in_use:
        client.create_training_job(**_request("twice", training_command("--steps", "1"), []))
    assert in_use.value.response["Error"]["Code"] == "ResourceInUse"


def test_sigv4_access_key_must_be_known(api) -> None:
    import boto3

    stranger = boto3.session.Session(
        aws_access_key_id="AKIDUNKNOWN", aws_secret_access_key="x", region_name="us-east-1"
    )
    client = stranger.client("sagemaker", endpoint_url=api.url)
    with pytest.raises(ClientError) as refused:
        client.list_training_jobs()
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException"
    assert api.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []


def test_unavailable_profiler_rules_are_accepted_and_reported(api) -> None:
    client = api.sagemaker()
    profiler_rules = [{"RuleConfigurationName": "ProfilerReport-1700000000", "RuleEvaluatorImage": AWS_RULES_IMAGE,
                       "RuleParameters": {"rule_to_invoke": "ProfilerReport", "CPUBottleneck_threshold": "90"}}]  # fmt: skip
    client.create_training_job(
        **_request("with-profiler", training_command("--steps", "1"), [], ProfilerRuleConfigurations=profiler_rules)
    )
    description = client.describe_training_job(TrainingJobName="with-profiler")
    status = description["ProfilerRuleEvaluationStatuses"][0]
    assert status["RuleEvaluationStatus"] == "Error"
    assert status["StatusDetails"].startswith("RuleNotAvailable:")
    assert description["ProfilingStatus"] == "Disabled"


@pytest.mark.slow
def test_max_runtime_stops_the_job_as_max_runtime_exceeded(api) -> None:
    client = api.sagemaker()
    request = _request("too-slow", training_command("--steps", "600", "--step-seconds", "0.05"), [])
    request["StoppingCondition"] = {"MaxRuntimeInSeconds": 3}
    client.create_training_job(**request)

    def stopped() -> dict | None:
        description = client.describe_training_job(TrainingJobName="too-slow")
        return description if description["TrainingJobStatus"] == "Stopped" else None

    description = wait_for(stopped, 60, "the runtime limit to stop the job")
    assert description["SecondaryStatus"] == "MaxRuntimeExceeded"
    assert description["SecondaryStatusTransitions"][-1]["StatusMessage"] == "MaxRuntimeInSeconds (3) exceeded"
    assert client.list_training_jobs(StatusEquals="Stopped")["TrainingJobSummaries"][0]["TrainingJobName"] == "too-slow"


@pytest.mark.slow
def test_custom_rule_from_source_s3_uri_as_the_sdk_sends_it(api, s3_endpoint, monkeypatch, tmp_path) -> None:
    """Rule.custom(source=..., rule_to_invoke=...): the rule file is fetched from S3 by the runner."""
    from tests.s3_server import create_bucket, s3_client, set_dummy_credentials

    set_dummy_credentials(monkeypatch, tmp_path)
    bucket = create_bucket(s3_endpoint)
    source = (REPO / "tests" / "services" / "rules_for_tests.py").read_text()
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="rules/my_rules.py", Body=source.encode())
    api.kill()
    api.environment["S3_ENDPOINT_URL"] = s3_endpoint
    api.start()
    client = api.sagemaker()
    rules = [
        {"RuleConfigurationName": "CustomLoss", "RuleEvaluatorImage": AWS_EVALUATOR_IMAGE,
         "InstanceType": "ml.t3.medium", "VolumeSizeInGB": 30,
         "RuleParameters": {"source_s3_uri": f"s3://{bucket}/rules/my_rules.py", "rule_to_invoke": "LossAboveThreshold",
                            "threshold": "1000.0"}},
    ]  # fmt: skip
    client.create_training_job(**_request("custom-src", training_command("--steps", "8", "--blowup-at", "3"), rules))

    def rule_done() -> dict | None:
        description = client.describe_training_job(TrainingJobName="custom-src")
        status = description["DebugRuleEvaluationStatuses"][0]
        return status if status["RuleEvaluationStatus"] != "InProgress" else None

    status = wait_for(rule_done, 90, "the custom rule to finish")
    assert status["RuleEvaluationStatus"] == "IssuesFound", status
    expected = "RuleEvaluationConditionMet: Evaluation of the rule LossAboveThreshold at step "
    assert status["StatusDetails"].startswith(expected)


def test_a_collection_no_hook_fills_is_dropped_on_the_sagemaker_api_but_refused_natively() -> None:
    # SageMaker accepts a CollectionName that is neither built in nor given an include_regex
    # (smdebug makes an empty collection of it): an SDK job naming one must still start.
    from pydantic import ValidationError

    from trainguard.services.api.sagemaker import job_spec_from_request
    from trainguard.services.api.schemas import JobSpec

    request = _request("odd-collection", training_command("--steps", "2"), [])
    entries = request["DebugHookConfig"]["CollectionConfigurations"]
    entries += [{"CollectionName": "my_layers"},
                {"CollectionName": "mine", "CollectionParameters": {"include_regex": ".*fc1.*"}}]  # fmt: skip
    spec, _, _ = job_spec_from_request(request)
    kept = [entry["CollectionName"] for entry in spec.hook_config["CollectionConfigurations"]]
    assert kept == ["losses", "losses", "mine"]
    native = {"name": "odd-native", "command": ["python", "train.py"], "hook_config": request["DebugHookConfig"]}
    with pytest.raises(ValidationError, match="my_layers"):
        JobSpec.model_validate(native)
