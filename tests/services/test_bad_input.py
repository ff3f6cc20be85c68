"""Every malformed request of issue 12 is a 4xx naming the member, and leaves no job behind.

The app runs in-process (FastAPI's TestClient) with the real local launcher and SQLite; the
SageMaker endpoint gets raw awsJson (boto3 would refuse these requests on the client side). After
every refused CreateTrainingJob the name must still be free: DescribeTrainingJob answers
ResourceNotFound, never 500, and no row is listed.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_for
from tests.services.conftest import TOKEN, training_command

pytest.importorskip("httpx", reason="TestClient needs httpx")
from fastapi.testclient import TestClient  # noqa: E402
from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402

from trainguard.rules.base import RuleStatus, StepResult  # noqa: E402
from trainguard.rules.status_update import StatusUpdate  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = "bad-input-job"


@pytest.fixture
def client(tmp_path: Path):
    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RECONCILE_INTERVAL": "0.2", "TRAINGUARD_STOP_GRACE_SECONDS": "5"}
    )  # fmt: skip
    with TestClient(create_app(settings)) as test_client:
        yield test_client
        for job in test_client.get("/v1/jobs", headers=AUTH).json()["jobs"]:
            test_client.post(f"/v1/jobs/{job['name']}/stop?grace_seconds=0", headers=AUTH)


def sagemaker(client: TestClient, operation: str, body: Any, *, raw: bytes | None = None) -> tuple[int, dict]:
    content = raw if raw is not None else json.dumps(body).encode()
    response = client.post(
        "/", content=content,
        headers={**AUTH, "X-Amz-Target": f"SageMaker.{operation}", "Content-Type": "application/x-amz-json-1.1"},
    )  # fmt: skip
    return response.status_code, response.json()


def create_request(**members: Any) -> dict[str, Any]:
    """A valid CreateTrainingJob request with ``members`` replaced (None = removed)."""
    request = {
        "TrainingJobName": NAME,
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/"},
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ["python"], "ContainerArguments": ["train.py"]},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "DebugRuleConfigurations": [{"RuleConfigurationName": "Loss", "RuleEvaluatorImage": "img",
                                     "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}}],
    }  # fmt: skip
    request.update(members)
    return {k: v for k, v in request.items() if v is not None}


def rule(**parameters: Any) -> list[dict[str, Any]]:
    return [{"RuleConfigurationName": "Loss", "RuleEvaluatorImage": "img",
             "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", **parameters}}]  # fmt: skip


def assert_no_job(client: TestClient, name: str = NAME) -> None:
    status, body = sagemaker(client, "DescribeTrainingJob", {"TrainingJobName": name})
    assert (status, body["__type"]) == (400, "ResourceNotFound"), body
    assert client.get(f"/v1/jobs/{name}", headers=AUTH).status_code == 404
    assert all(job["name"] != name for job in client.get("/v1/jobs", headers=AUTH).json()["jobs"])


def _algorithm(**members: Any) -> dict[str, Any]:
    return {"TrainingImage": "img", "TrainingInputMode": "File", "ContainerEntrypoint": ["python"],
            "ContainerArguments": ["train.py"], **members}  # fmt: skip


def _sdk_action(**action: Any) -> str:
    return json.dumps([{"name": "webhook", "url": "http://127.0.0.1:9/hook", **action}])


CREATE_CASES = [
    ({"AlgorithmSpecification": "python train.py"}, "'AlgorithmSpecification'"),
    ({"AlgorithmSpecification": {"ContainerEntrypoint": "python"}}, "AlgorithmSpecification.ContainerEntrypoint'"),
    ({"AlgorithmSpecification": {"ContainerEntrypoint": ["python", 3]}},
     "AlgorithmSpecification.ContainerEntrypoint[1]"),
    ({"AlgorithmSpecification": {"ContainerArguments": {"a": 1}}}, "AlgorithmSpecification.ContainerArguments"),
    ({"Environment": ["A=1"]}, "'Environment'"),
    ({"Environment": {"A": 1}}, "'Environment.A'"),
    ({"Environment": {"A": "x" * 600}}, "'Environment.A'"),
    ({"Environment": {"BAD KEY": "1"}}, "'Environment.BAD KEY'"),
    ({"HyperParameters": "lr=1"}, "'HyperParameters'"),
    ({"HyperParameters": {"lr": {"value": 1}}}, "'HyperParameters.lr'"),
    ({"DebugRuleConfigurations": {"RuleConfigurationName": "Loss"}}, "'DebugRuleConfigurations'"),
    ({"DebugRuleConfigurations": ["Loss"]}, "'DebugRuleConfigurations[0]'"),
    ({"DebugRuleConfigurations": [{"RuleParameters": {}}]}, "DebugRuleConfigurations[0].RuleConfigurationName"),
    ({"DebugRuleConfigurations": [{"RuleConfigurationName": "L", "RuleParameters": "a=1"}]},
     "DebugRuleConfigurations[0].RuleParameters'"),
    ({"DebugRuleConfigurations": rule(threshold=5)}, "DebugRuleConfigurations[0].RuleParameters.threshold"),
    ({"StoppingCondition": 600}, "'StoppingCondition'"),
    ({"StoppingCondition": {"MaxRuntimeInSeconds": "600"}}, "StoppingCondition.MaxRuntimeInSeconds"),
    ({"StoppingCondition": {"MaxRuntimeInSeconds": 2**70}}, "StoppingCondition.MaxRuntimeInSeconds"),
    ({"TrainingJobName": 5}, "'TrainingJobName'"),
    ({"TrainingJobName": "has_underscore"}, "'TrainingJobName'"),
    ({"DebugHookConfig": {"HookParameters": ["save_interval"]}}, "DebugHookConfig.HookParameters"),
    ({"DebugHookConfig": {"CollectionConfigurations": [{"CollectionName": 1}]}},
     "DebugHookConfig.CollectionConfigurations[0].CollectionName"),
    ({"ProfilerConfig": {"DisableProfiler": "yes"}}, "ProfilerConfig.DisableProfiler"),
    ({"InputDataConfig": {"ChannelName": "train"}}, "'InputDataConfig'"),
    # Rule references and parameters the translation passes on.
    ({"DebugRuleConfigurations": rule(rule_to_invoke=".x:Y")}, "rule_to_invoke"),
    ({"DebugRuleConfigurations": rule(rule_to_invoke="os:system")}, "rule_to_invoke"),
    ({"DebugRuleConfigurations": rule(start_step="abc")}, "start_step"),
    ({"DebugRuleConfigurations": rule(start_step="5", end_step="2")}, "end_step"),
    ({"DebugRuleConfigurations": rule(start_step="\u00b2")}, "start_step"),
    ({"DebugRuleConfigurations": rule(start_step="9" * 4000)}, "start_step"),
    ({"DebugRuleConfigurations": rule(action_json=_sdk_action(retries=1000000))}, "retries"),
    ({"DebugRuleConfigurations": rule(action_json=_sdk_action(retries="many"))}, "retries"),
    ({"DebugRuleConfigurations": rule(action_json=json.dumps([{"name": "stoptraining", "grace_seconds": 1e308}]))},
     "grace_seconds"),
    ({"DebugRuleConfigurations": rule(action_json=json.dumps([{"name": "stoptraining", "grace_seconds": "inf"}]))},
     "grace_seconds"),
    ({"DebugRuleConfigurations": rule(action_json=_sdk_action(url="file:///etc/passwd"))}, "url"),
    # Text no process or database can take, anywhere in the request.
    ({"AlgorithmSpecification": {"ContainerEntrypoint": ["python\x00-c"]}},
     "AlgorithmSpecification.ContainerEntrypoint[0]"),
    ({"Environment": {"A": "\x00"}}, "'Environment.A'"),
    ({"HyperParameters": {"lr": "\ud800"}}, "'HyperParameters.lr'"),
    ({"Tags": [{"Key": "k", "Value": "\udfff"}]}, "Tags[0].Value"),
    # Issue 44: accepted and failing later, or running other than asked.
    ({"AlgorithmSpecification": _algorithm(MetricDefinitions=[{"Name": "x", "Regex": r"(a)\1"}])},
     "AlgorithmSpecification.MetricDefinitions[0].Regex"),
    ({"AlgorithmSpecification": _algorithm(MetricDefinitions=[{"Name": "x", "Regex": r"loss(?=:)"}])},
     "AlgorithmSpecification.MetricDefinitions[0].Regex"),
    ({"AlgorithmSpecification": _algorithm(MetricDefinitions=[{"Name": "x"}])},
     "AlgorithmSpecification.MetricDefinitions[0].Regex"),
    ({"ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 10}},
     "ResourceConfig.InstanceCount"),
    ({"DebugRuleConfigurations": [{"RuleConfigurationName": "L" * 256, "RuleEvaluatorImage": "img",
                                   "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}}]},
     "DebugRuleConfigurations[0].RuleConfigurationName"),
    ({"DebugHookConfig": {"S3OutputPath": "s3://bkt/", "HookParameters": {"include_regex": "(unclosed"}}},
     "DebugHookConfig"),
    ({"DebugHookConfig": {"S3OutputPath": 5}}, "DebugHookConfig.S3OutputPath"),
    ({"ProfilerConfig": {"ProfilingIntervalInMilliseconds": "soon"}}, "ProfilerConfig.ProfilingIntervalInMilliseconds"),
    ({"DebugRuleConfigurations": rule(action_json=_sdk_action(url="http://127.0.0.1:9/hook\r\nX-Injected: 1"))},
     "action_json"),
    ({"DebugRuleConfigurations": rule(action_json=_sdk_action(headers={"X-Token": "a\nX-Injected: 1"}))},
     "action_json"),
    ({"DebugRuleConfigurations": rule(action_json=json.dumps(
        [{"name": "email", "endpoint": "ops@example.com\r\nBcc: all@example.com"}]))}, "action_json"),
    ({"DebugRuleConfigurations": [{"RuleConfigurationName": "FI", "RuleEvaluatorImage": "img",
                                   "RuleParameters": {"rule_to_invoke": "FeatureImportanceOverweight",
                                                      "tensor_regex": "(" * 2000 + ")" * 2000}}]},
     "DebugRuleConfigurations[0]: parameters"),
    # Valid members whose container contract (one environment variable) exec could not take.
    ({"HyperParameters": {f"hp{i}": "x" * 2500 for i in range(60)}}, "HyperParameters"),
]  # fmt: skip


@pytest.mark.parametrize(("members", "member"), CREATE_CASES, ids=[str(i) for i in range(len(CREATE_CASES))])
def test_create_with_a_bad_member_is_a_validation_exception_naming_it(client, members, member) -> None:
    status, body = sagemaker(client, "CreateTrainingJob", create_request(**members))
    assert status == 400, body
    assert body["__type"] == "ValidationException", body
    assert member in body["message"], body["message"]
    assert_no_job(client)


def test_lone_surrogate_and_nul_in_raw_json_are_refused_before_anything_is_created(client) -> None:
    # json.dumps would escape them the same way; written out to be sure the escapes reach the server.
    template = json.dumps(create_request(Environment={"A": "PLACEHOLDER"}))
    for escape in ("\\ud800", "\\u0000", "a\\udc00b"):
        raw = template.replace("PLACEHOLDER", escape).encode()
        status, body = sagemaker(client, "CreateTrainingJob", None, raw=raw)
        assert (status, body["__type"]) == (400, "ValidationException"), body
        assert "Environment.A" in body["message"]
        assert_no_job(client)
    # Invalid UTF-8 and absurd nesting are SerializationExceptions, not crashes.
    status, body = sagemaker(client, "CreateTrainingJob", None, raw=b'{"TrainingJobName": "\xff\xfe"}')
    assert (status, body["__type"]) == (400, "SerializationException")
    status, body = sagemaker(client, "CreateTrainingJob", None, raw=b"[" * 100_000 + b"]" * 100_000)
    assert (status, body["__type"]) == (400, "SerializationException")


LIST_CASES = [
    ({"MaxResults": "abc"}, "MaxResults"),
    ({"MaxResults": 0}, "MaxResults"),
    ({"MaxResults": 101}, "MaxResults"),
    ({"MaxResults": True}, "MaxResults"),
    ({"CreationTimeAfter": "x"}, "CreationTimeAfter"),
    ({"LastModifiedTimeBefore": [1]}, "LastModifiedTimeBefore"),
    ({"NameContains": 5}, "NameContains"),
    ({"NameContains": "a b"}, "NameContains"),
    ({"NextToken": "-5"}, "NextToken"),
    ({"NextToken": 5}, "NextToken"),
    ({"NextToken": "9" * 100}, "NextToken"),
    ({"StatusEquals": "Running"}, "StatusEquals"),
    ({"SortBy": "Size"}, "SortBy"),
    ({"SortOrder": 1}, "SortOrder"),
]


@pytest.mark.parametrize(("members", "member"), LIST_CASES, ids=[str(i) for i in range(len(LIST_CASES))])
def test_list_with_a_bad_member_is_a_validation_exception_naming_it(client, members, member) -> None:
    status, body = sagemaker(client, "ListTrainingJobs", members)
    assert (status, body["__type"]) == (400, "ValidationException"), body
    assert f"'{member}'" in body["message"], body["message"]


def test_log_reads_with_tokens_this_server_never_handed_out_are_refused(client) -> None:
    """GetLogEvents (fit(logs=True)): a nextToken is 'f/<ASCII digits>'; '²' is a digit to
    str.isdigit but not to int(), and 5,000 digits are over int()'s limit: both were 500s, as was a
    stream name with a lone surrogate (the database lookup)."""
    import time

    assert client.post("/v1/jobs", headers=AUTH, json=_spec()).status_code == 201
    deadline = time.monotonic() + 20
    status, described = sagemaker(client, "DescribeTrainingJob", {"TrainingJobName": NAME})
    while "TrainingStartTime" not in described and time.monotonic() < deadline:
        time.sleep(0.1)
        status, described = sagemaker(client, "DescribeTrainingJob", {"TrainingJobName": NAME})
    stream = f"{NAME}/algo-1-{int(float(described['TrainingStartTime']))}"
    group = "/aws/sagemaker/TrainingJobs"
    response = client.post("/", content=json.dumps({"logGroupName": group, "logStreamName": stream}),
                           headers={**AUTH, "X-Amz-Target": "Logs_20140328.GetLogEvents"})  # fmt: skip
    assert response.status_code == 200, response.text
    for token in ("f/\u00b2", "f/" + "9" * 5000, "f/-1", "b/0", 7):
        body = {"logGroupName": group, "logStreamName": stream, "nextToken": token}
        response = client.post("/", content=json.dumps(body),
                               headers={**AUTH, "X-Amz-Target": "Logs_20140328.GetLogEvents"})  # fmt: skip
        assert response.status_code == 400, (token, response.text)
        assert response.json()["__type"] == "InvalidParameterException"
    # Names no database can look up (a lone surrogate, NUL, 10 kB) are refused, not a 500.
    for operation, member in (("GetLogEvents", "logStreamName"), ("DescribeLogStreams", "logStreamNamePrefix")):
        for name in ("\udfff tail", "job\x00", "x" * 10_000):
            body = {"logGroupName": group, member: name}
            response = client.post("/", content=json.dumps(body),
                                   headers={**AUTH, "X-Amz-Target": f"Logs_20140328.{operation}"})  # fmt: skip
            assert response.status_code == 400, (operation, name[:8], response.text)
            assert member in response.json()["message"], response.text


def test_describe_and_stop_of_bad_or_unknown_names(client) -> None:
    for operation in ("DescribeTrainingJob", "StopTrainingJob"):
        for body in ({}, {"TrainingJobName": 5}, {"TrainingJobName": "x" * 64}, {"TrainingJobName": "a\x00"}):
            status, answer = sagemaker(client, operation, body)
            assert (status, answer["__type"]) == (400, "ValidationException"), (operation, body, answer)
            assert "TrainingJobName" in answer["message"]
        status, answer = sagemaker(client, operation, {"TrainingJobName": "never-created"})
        assert (status, answer["__type"]) == (400, "ResourceNotFound"), answer
    status, answer = sagemaker(client, "ListTrainingJobs", {"MaxResults": 5, "NextToken": "0", "CreationTimeAfter": 0})
    assert status == 200 and answer["TrainingJobSummaries"] == []


# -- native API ---------------------------------------------------------------------------------------
def post_json(client: TestClient, path: str, body: Any):  # noqa: ANN201 - a response
    """httpx refuses NaN/inf and lone surrogates; json.dumps writes them as a careless client would."""
    return client.post(path, headers={**AUTH, "Content-Type": "application/json"}, content=json.dumps(body).encode())


def _native(client: TestClient, spec: dict[str, Any]) -> list[tuple[str, str]]:
    response = post_json(client, "/v1/jobs", spec)
    assert response.status_code == 422, response.text
    return [(".".join(str(p) for p in item["loc"]), item["msg"]) for item in response.json()["detail"]]


def _spec(**members: Any) -> dict[str, Any]:
    return {"name": NAME, "command": ["python", "-c", "pass"], **members}


def _stop_action(**action: Any) -> list[dict[str, Any]]:
    return [{"rule": "LossNotDecreasing", "actions": [{"name": "stoptraining", **action}]}]


NATIVE_CASES = [
    (_spec(command="python train.py"), "body.command"),
    (_spec(command=["python", 1]), "body.command.1"),
    (_spec(command=["python", "a\x00b"]), "body.command.1"),
    (_spec(environment={"A": "\ud800"}), "body.environment.A"),
    (_spec(environment={"A": 1}), "body.environment.A"),
    (_spec(environment="A=1"), "body.environment"),
    (_spec(resources={"cpus": 1e308}), "body.resources.cpus"),
    (_spec(resources={"cpus": math.inf}), "body.resources.cpus"),
    (_spec(resources={"memory_mb": 2**70}), "body.resources.memory_mb"),
    (_spec(resources={"memory_mb": "512"}), "body.resources.memory_mb"),
    (_spec(stopping_condition={"max_runtime_seconds": 10**12}), "body.stopping_condition.max_runtime_seconds"),
    (_spec(alarms=[{"name": "a", "threshold": math.nan}]), "body.alarms.0.threshold"),
    (_spec(alarms=[{"name": "a", "threshold": math.inf}]), "body.alarms.0.threshold"),
    (_spec(rules=[{"rule": ".x:Y"}]), "body.rules.0.rule"),
    (_spec(rules=[{"rule": "os:system"}]), "body.rules.0.rule"),
    (_spec(rules=[{"rule": "LossNotDecreasing", "parameters": {"start_step": "abc"}}]), "body.rules.0.parameters"),
    (_spec(rules=[{"rule": "LossNotDecreasing", "parameters": {"threshold": math.nan}}]), "body.rules.0.parameters"),
    (_spec(rules=[{"rule": "LossNotDecreasing", "name": "../../etc"}]), "body.rules.0.name"),
    (_spec(rules=_stop_action(grace_seconds=1e308)), "body.rules.0.actions"),
    (_spec(rules=_stop_action(grace_seconds="inf")), "body.rules.0.actions"),
    (_spec(rules=[{"rule": "LossNotDecreasing",
                   "actions": [{"name": "webhook", "url": "http://x", "retries": 10**6}]}]),
     "body.rules.0.actions"),
    (_spec(rules=[{"rule": "LossNotDecreasing", "actions": [{"name": "webhook", "url": "file:///etc/passwd"}]}]),
     "body.rules.0.actions"),
    (_spec(hook_config={"HookParameters": {"save_interval": "1\x00"}}), "body.hook_config"),
    (_spec(working_dir="/etc"), "body.working_dir"),
    # Issue 44: accepted and failing later, or running other than asked.
    (_spec(hook_config={"HookParameters": {"include_regex": "(unclosed"}}), "body.hook_config"),
    (_spec(hook_config={"S3OutputPath": 5}), "body.hook_config"),
    (_spec(hook_config={"S3OutputPath": ["s3://bkt/"]}), "body.hook_config"),
    (_spec(profiler_config={"ProfilingIntervalInMilliseconds": "soon"}), "body.profiler_config"),
    (_spec(profiler_config={"DisableProfiler": "no"}), "body.profiler_config"),
    (_spec(rules=[{"rule": "LossNotDecreasing", "name": "a" * 256}]), "body.rules.0.name"),
    (_spec(environment={"A": "x" * 140_000}), "body.environment"),
    (_spec(environment={f"V{i}": "x" * 100_000 for i in range(6)}), "body.environment"),
    (_spec(command=["python", "\u00e9" * 70_000]), "body.command"),
    (_spec(rules=[{"rule": "LossNotDecreasing",
                   "actions": [{"name": "webhook", "url": "http://127.0.0.1:9/\r\nX-Injected: 1"}]}]),
     "body.rules.0.actions"),
    (_spec(rules=[{"rule": "LossNotDecreasing",
                   "actions": [{"name": "webhook", "url": "http://127.0.0.1:9/", "headers": {"X-A": "1\nX-B: 2"}}]}]),
     "body.rules.0.actions"),
    (_spec(rules=[{"rule": "LossNotDecreasing",
                   "actions": [{"name": "email", "endpoint": "ops@example.com\nBcc: all@example.com"}]}]),
     "body.rules.0.actions"),
    (_spec(resources={"cpus": 0.001}), "body.resources.cpus"),
    (_spec(resources={"memory_mb": 1}), "body.resources.memory_mb"),
    (_spec(resources={"instance_count": 2}), "body.resources.instance_count"),
    # Regexes nested deeper than Python's parser recurses (were 500s, or accepted and failing later).
    (_spec(hook_config={"HookParameters": {"include_regex": "(" * 1000 + ")" * 1000}}), "body.hook_config"),
    (_spec(hook_config={"CollectionConfigurations": [
        {"CollectionName": "x", "CollectionParameters": {"include_regex": "(" * 1000 + ")" * 1000}}]}),
     "body.hook_config"),
    (_spec(rules=[{"rule": "FeatureImportanceOverweight", "parameters": {"tensor_regex": "(" * 1000 + ")" * 1000}}]),
     "body.rules.0"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "location"), NATIVE_CASES, ids=[str(i) for i in range(len(NATIVE_CASES))])
def test_native_bad_spec_is_422_with_the_field_path(client, spec, location) -> None:
    errors = _native(client, spec)
    assert any(loc == location or loc.startswith(location + ".") for loc, _ in errors), errors
    assert_no_job(client)


def test_deep_regexes_are_refused_whatever_the_recursion_limit(client) -> None:
    """torch.compile raises the recursion limit of the process that runs it (to 2000): a regex
    nested 1000 deep then compiles in the API, yet fails in the job's fresh interpreter. The bound
    is explicit, so the answer is the same in both."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 5000))
    try:
        for spec, location in NATIVE_CASES[-3:]:  # the three regexes nested 1000 deep
            errors = _native(client, spec)
            assert any(loc == location or loc.startswith(location + ".") for loc, _ in errors), errors
            assert any("nests 1000 groups" in message for _, message in errors), errors
    finally:
        sys.setrecursionlimit(previous)
    assert_no_job(client)


def test_native_query_and_path_bounds(client) -> None:
    assert client.get("/v1/jobs?status=Bogus", headers=AUTH).status_code == 422
    assert client.get("/v1/jobs?name_contains=" + "a" * 64, headers=AUTH).status_code == 422
    assert client.post("/v1/jobs/x/stop?grace_seconds=inf", headers=AUTH).status_code == 422
    assert client.post("/v1/jobs/x/stop?grace_seconds=1e308", headers=AUTH).status_code == 422
    assert client.get("/v1/jobs/x/logs?tail=abc", headers=AUTH).status_code == 422
    for name in ("a%00b", "x" * 300, "..", "never-created"):
        assert client.get(f"/v1/jobs/{name}", headers=AUTH).status_code == 404
        assert client.post(f"/v1/jobs/{name}/stop", headers=AUTH).status_code == 404


def test_a_refused_job_leaves_its_name_free_and_a_valid_one_then_runs(client) -> None:
    assert _native(client, _spec(command=["python", "-c", "print('a\x00')"]))
    assert_no_job(client)
    response = client.post("/v1/jobs", headers=AUTH, json=_spec(command=training_command("--steps", "3")))
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "InProgress"
    assert client.post("/v1/jobs", headers=AUTH, json=_spec()).status_code == 409


# -- the rule-status route ----------------------------------------------------------------------------
@pytest.fixture
def rule_job(client) -> str:
    spec = _spec(command=training_command("--steps", "400", "--step-seconds", "0.05"),
                 rules=[{"rule": "LossNotDecreasing", "name": "Loss"}])  # fmt: skip
    response = client.post("/v1/jobs", headers=AUTH, json=spec)
    assert response.status_code == 201, response.text
    return f"/v1/internal/jobs/{NAME}/rules/Loss/status"


STATUS_CASES = [
    ({"status": "Bogus"}, "body.status"),
    ({"status": 3}, "body.status"),
    ({"last_evaluated_step": "7"}, "body.last_evaluated_step"),
    ({"last_evaluated_step": 2**70}, "body.last_evaluated_step"),
    ({"step": 1e400}, "body.step"),
    ({"datapoints": [{"value": "x"}]}, "body.datapoints.0.value"),
    ({"datapoints": [{"value": math.inf, "step": 1}]}, "body.datapoints.0.value"),
    ({"datapoints": [{"value": 1.0, "step": 2**80}]}, "body.datapoints.0.step"),
    ({"datapoints": "many"}, "body.datapoints"),
    ({"result": {"step": 1, "fired": "yes"}}, "body.result.fired"),
    ({"result": {"step": 1, "missing": [{"what": 5}]}}, "body.result.missing.0.what"),
    ({"result": {"step": 1, "message": "a\x00"}}, "body.result.message"),
    ({"status_details": ["x"]}, "body.status_details"),
    ({"timestamp": "now"}, "body.timestamp"),
]


def test_rule_status_route_refuses_wrong_types_and_keeps_final_statuses(client, rule_job) -> None:
    for update, location in STATUS_CASES:
        response = post_json(client, rule_job, update)
        assert response.status_code == 422, (update, response.text)
        locations = [".".join(str(p) for p in item["loc"]) for item in response.json()["detail"]]
        assert any(loc.startswith(location) for loc in locations), (update, locations)
    assert client.post(rule_job.replace("/Loss/", "/Nope/"), headers=AUTH, json={}).status_code == 404
    assert client.post(rule_job.replace(NAME, "no-such-job"), headers=AUTH, json={}).status_code == 404
    # A finding whose details hold NaN/inf (a loss that blew up) is kept, and describes as JSON text.
    finding = StatusUpdate(
        "Loss", "LossNotDecreasing", RuleStatus.IN_PROGRESS, step=4,
        result=StepResult(rule="LossNotDecreasing", step=4, fired=True, message="loss is nan",
                          details={"loss": math.nan, "peak": math.inf, "steps": [1.0, -math.inf]}),
    )  # fmt: skip
    assert post_json(client, rule_job, finding.to_dict()).status_code == 200
    described = client.get(f"/v1/jobs/{NAME}", headers=AUTH)
    assert described.status_code == 200, described.text
    details = described.json()["rules"][0]["findings"][0]["details"]
    assert details == {"loss": "NaN", "peak": "Infinity", "steps": [1.0, "-Infinity"]}
    # A report resent from the runner's outbox (its answer was lost) is acknowledged, applied once.
    batch = {"datapoints": [{"metric": "RuleIssuesFound", "value": 1.0, "step": 7}], "outbox": "ob-1", "sequence": 3}
    assert post_json(client, rule_job, batch).json() == {"accepted": True}
    assert post_json(client, rule_job, batch).json()["applied"] is False
    assert post_json(client, rule_job, {**batch, "sequence": 2}).json()["applied"] is False
    assert post_json(client, rule_job, {**batch, "outbox": "ob-2"}).json() == {"accepted": True}
    assert post_json(client, rule_job, {**batch, "sequence": -1}).status_code == 422
    assert post_json(client, rule_job, {**batch, "outbox": "x" * 65}).status_code == 422
    # A valid final status sticks: a later different one is acknowledged but not applied.
    ended = client.post(rule_job, headers=AUTH, json={"status": "NoIssuesFound", "last_evaluated_step": 9})
    assert ended.status_code == 200 and ended.json() == {"accepted": True}
    late = client.post(rule_job, headers=AUTH, json={"status": "IssuesFound", "status_details": "late"})
    assert late.status_code == 200 and late.json()["applied"] is False
    rules = client.get(f"/v1/jobs/{NAME}", headers=AUTH).json()["rules"]
    assert rules[0]["status"] == "NoIssuesFound", rules


# -- a launch refused after the create was accepted ends the job Failed with the reason -----------------
def test_a_launch_refused_half_way_ends_the_job_failed_with_the_reason_and_no_process(tmp_path: Path) -> None:
    """Fault injection: the real local launcher starts the training process, then the next component
    is refused with a ValueError. The create was accepted (launches run in the background launch
    queue, as SageMaker's), so the job must end Failed naming the error, with no process left."""
    import dataclasses
    import time

    from trainguard.services.launchers.base import JobLaunch
    from trainguard.services.launchers.local import LocalLauncher

    class RefusesSecondComponent(LocalLauncher):
        def start(self, job: JobLaunch) -> None:
            super().start(dataclasses.replace(job, components=job.components[:1]))
            raise ValueError("embedded null byte")

    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RECONCILE_INTERVAL": "0.2"}
    )  # fmt: skip
    launcher = RefusesSecondComponent(tmp_path / "local")
    spec = _spec(command=training_command("--steps", "400", "--step-seconds", "0.05"),
                 rules=[{"rule": "LossNotDecreasing", "name": "Loss"}])  # fmt: skip
    with TestClient(create_app(settings, launcher=launcher)) as client:
        response = post_json(client, "/v1/jobs", spec)
        assert response.status_code == 201, response.text
        # generous deadlines: the launch queue and the stop run in the background, and under a
        # full-suite load starting and stopping a training process takes seconds
        deadline = time.monotonic() + 90
        job = client.get(f"/v1/jobs/{NAME}", headers=AUTH).json()
        while job["status"] != "Failed" and time.monotonic() < deadline:
            time.sleep(0.1)
            job = client.get(f"/v1/jobs/{NAME}", headers=AUTH).json()
        assert job["status"] == "Failed", job
        assert "could not be launched: embedded null byte" in json.dumps(job), job
        # the training process that did start is stopped
        wait_for(
            lambda: all(status.state.value != "Running" for status in launcher.status(NAME).values()),
            60, "the started training process stopped",
        )  # fmt: skip
        status, body = sagemaker(client, "DescribeTrainingJob", {"TrainingJobName": NAME})
        assert status == 200 and body["TrainingJobStatus"] == "Failed", body
        assert "embedded null byte" in body["FailureReason"], body


def test_concurrent_creations_one_name_one_winner_and_different_names_all_created(client) -> None:
    """Creations are not serialised behind each other, yet a name is taken exactly once."""
    import threading

    from trainguard.services.api.jobs import JobExists
    from trainguard.services.api.schemas import JobSpec

    service = client.app.state.service
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def create(name: str) -> None:
        spec = JobSpec.model_validate(_spec(name=name, command=training_command("--steps", "2")))
        barrier.wait()
        try:
            service.create(spec)
            outcomes.append("created")
        except JobExists:
            outcomes.append("exists")

    for names in (["same-name"] * 8, [f"name-{i}" for i in range(8)]):
        outcomes.clear()
        threads = [threading.Thread(target=create, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        expected = ["created"] if len(set(names)) == 1 else ["created"] * 8
        assert sorted(outcomes) == sorted(expected + ["exists"] * (8 - len(expected))), outcomes
    listed = {job["name"] for job in client.get("/v1/jobs", headers=AUTH).json()["jobs"]}
    assert listed == {"same-name", *(f"name-{i}" for i in range(8))}
