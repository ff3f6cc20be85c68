"""A seeded fuzzer for the SageMaker JSON protocol: random types in every member, never a 5xx.

Each request starts from a valid CreateTrainingJob (or List/Describe/Stop, or the CloudWatch Logs
reads DescribeLogStreams/GetLogEvents) request and replaces one to three members, at any depth, by
a value of a random type: null, booleans, huge and negative integers, NaN/inf/1e308, strings with
NUL bytes, lone surrogates, line breaks, Unicode digits, catastrophic regexes or 10 kB, lists and
maps. Every answer must be 2xx or 4xx with an awsJson error; afterwards every name whose creation
was refused must be free (ResourceNotFound), and every job that was accepted must describe and have
been launched (no row left Starting with nothing started).

``TRAINGUARD_FUZZ_SEED`` and ``TRAINGUARD_FUZZ_REQUESTS`` reproduce or lengthen a run.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.services.conftest import TOKEN, wait_for

pytest.importorskip("httpx", reason="TestClient needs httpx")
from fastapi.testclient import TestClient  # noqa: E402
from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HARMLESS = [sys.executable, "-c", "pass"]
SEEDS = [int(os.environ.get("TRAINGUARD_FUZZ_SEED", "0")) + offset for offset in range(3)]
REQUESTS = int(os.environ.get("TRAINGUARD_FUZZ_REQUESTS", "150"))


def valid_create(name: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": HARMLESS[:1], "ContainerArguments": HARMLESS[1:],
                                   "MetricDefinitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}]},
        "Environment": {"MODE": "fuzz"},
        "HyperParameters": {"lr": "0.1", "epochs": "1"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 60},
        "DebugHookConfig": {"S3OutputPath": "s3://bkt/", "HookParameters": {"save_interval": "1"},
                            "CollectionConfigurations": [{"CollectionName": "losses",
                                                          "CollectionParameters": {"save_interval": "1"}}]},
        "DebugRuleConfigurations": [
            {"RuleConfigurationName": "Loss", "RuleEvaluatorImage": "img",
             "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "start_step": "0",
                                "action_json": json.dumps([{"name": "stoptraining", "grace_seconds": 1}])}},
        ],
        "ProfilerConfig": {"S3OutputPath": "s3://bkt/", "DisableProfiler": True},
        "ProfilerRuleConfigurations": [{"RuleConfigurationName": "ProfilerReport", "RuleEvaluatorImage": "img",
                                        "RuleParameters": {"rule_to_invoke": "ProfilerReport"}}],
        "Tags": [{"Key": "k", "Value": "v"}],
    }  # fmt: skip


def random_value(rng: random.Random, depth: int = 0) -> Any:
    choices = [
        lambda: None, lambda: rng.choice([True, False]),
        lambda: rng.choice([0, -1, 1, 7, 2**31, 2**63, 2**70, -(2**70)]),
        lambda: rng.choice([0.5, -0.0, 1e308, -1e308, float("nan"), float("inf"), float("-inf")]),
        lambda: rng.choice(["", "x", "abc", "-5", "1e999", "python", ".x:Y", "os:system", "../../etc",
                            "a\x00b", "\ud800", "\udfff tail", "é✓", "x" * 10_000, "s3://", "file:///etc/passwd",
                            "(a+)+$", r"(a)\1", "f/\u00b2", "\u00b2", "http://x/\r\nX: 1", "a" * 256]),
        lambda: [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))] if depth < 3 else [],
        lambda: {rng.choice(["a", "", "\x00", "\ud800", "Key", "rule_to_invoke"]): random_value(rng, depth + 1)
                 for _ in range(rng.randint(0, 3))} if depth < 3 else {},
    ]  # fmt: skip
    return rng.choice(choices)()


def _paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every member path in a request (dict keys and list indexes), the root's members included."""
    found = []
    if isinstance(document, dict):
        for key, value in document.items():
            found.append((*prefix, key))
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found.append((*prefix, index))
            found.extend(_paths(value, (*prefix, index)))
    return found


def mutate(rng: random.Random, request: dict[str, Any]) -> dict[str, Any]:
    request = copy.deepcopy(request)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(request)
        if not paths:
            break
        path = rng.choice(paths)
        parent = request
        for part in path[:-1]:
            parent = parent[part]
        if rng.random() < 0.15 and isinstance(parent, dict):
            parent.pop(path[-1], None)  # a member left out
        else:
            parent[path[-1]] = random_value(rng)
    if rng.random() < 0.1:
        request[rng.choice(["Unknown", "NextToken", "MaxResults"])] = random_value(rng)
    return request


def _harmless(request: dict[str, Any]) -> dict[str, Any]:
    """A valid command is swapped for a harmless one: the fuzzing is about the API, not running programs."""
    algorithm = request.get("AlgorithmSpecification")
    if isinstance(algorithm, dict):
        entry, arguments = algorithm.get("ContainerEntrypoint"), algorithm.get("ContainerArguments")
        if isinstance(entry, list) and entry and all(isinstance(p, str) for p in entry):
            algorithm["ContainerEntrypoint"] = HARMLESS[:1]
            if isinstance(arguments, list) and all(isinstance(p, str) for p in arguments):
                algorithm["ContainerArguments"] = HARMLESS[1:]
    return request


LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def call(client: TestClient, operation: str, body: Any) -> tuple[int, Any]:
    """``operation``: a SageMaker one, or ``Logs_20140328.<Operation>`` (fit(logs=True)'s reads)."""
    target = operation if "." in operation else f"SageMaker.{operation}"
    response = client.post(
        "/", content=json.dumps(body).encode(),
        headers={**AUTH, "X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"},
    )  # fmt: skip
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


@pytest.fixture
def client(tmp_path: Path):
    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RECONCILE_INTERVAL": "0.2", "TRAINGUARD_STOP_GRACE_SECONDS": "1"}
    )  # fmt: skip
    with TestClient(create_app(settings)) as test_client:
        yield test_client
        for job in test_client.get("/v1/jobs", headers=AUTH).json()["jobs"]:
            test_client.post(f"/v1/jobs/{job['name']}/stop?grace_seconds=0", headers=AUTH)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_types_never_cause_a_server_error_or_a_ghost_job(client, seed) -> None:
    rng = random.Random(seed)
    refused: set[str] = set()
    accepted: set[str] = set()
    answers: dict[int, int] = {}
    for index in range(REQUESTS):
        operation = rng.choices(
            ["CreateTrainingJob", "ListTrainingJobs", "DescribeTrainingJob", "StopTrainingJob",
             "Logs_20140328.DescribeLogStreams", "Logs_20140328.GetLogEvents"], [6, 2, 1, 1, 1, 1],
        )[0]  # fmt: skip
        name = f"fuzz-{seed}-{index}"
        if operation == "CreateTrainingJob":
            body = _harmless(mutate(rng, valid_create(name)))
        elif operation == "ListTrainingJobs":
            body = mutate(rng, {"MaxResults": 5, "SortBy": "Name", "SortOrder": "Ascending", "NameContains": "fuzz",
                                "NextToken": "0", "CreationTimeAfter": 0, "StatusEquals": "InProgress"})  # fmt: skip
        elif operation.startswith("Logs_"):
            job = rng.choice(sorted(accepted)) if accepted else name
            _, streams = call(client, "Logs_20140328.DescribeLogStreams",
                              {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{job}/"})  # fmt: skip
            stream = ((streams.get("logStreams") or [{}])[0] if isinstance(streams, dict) else {}).get(
                "logStreamName", f"{job}/algo-1-0"
            )
            if operation.endswith("DescribeLogStreams"):
                body = mutate(rng, {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{job}/", "limit": 5})
            else:
                body = mutate(rng, {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True,
                                    "limit": 10, "startTime": 0, "nextToken": "f/0"})  # fmt: skip
        else:
            body = mutate(rng, {"TrainingJobName": rng.choice([*accepted, name]) if accepted else name})
        status, answer = call(client, operation, body)
        answers[status] = answers.get(status, 0) + 1
        assert status < 500, f"seed {seed} request {index}: {operation} {body!r:.2000} -> {status} {answer!r:.1000}"
        if status >= 400:
            assert isinstance(answer, dict) and answer.get("__type") and answer.get("message"), answer
        if operation == "CreateTrainingJob" and isinstance(body, dict) and body.get("TrainingJobName") == name:
            (accepted if status == 200 else refused).add(name)
    print(f"seed {seed}: answers {dict(sorted(answers.items()))}, {len(accepted)} jobs created, {len(refused)} refused")
    assert accepted and refused, (accepted, refused)  # the fuzz reached both outcomes
    for name in refused:
        status, answer = call(client, "DescribeTrainingJob", {"TrainingJobName": name})
        assert (status, answer["__type"]) == (400, "ResourceNotFound"), (name, answer)
    for name in accepted:
        status, answer = call(client, "DescribeTrainingJob", {"TrainingJobName": name})
        assert status == 200, answer
        wait_for(lambda name=name: launched(client, name), 30, f"{name}'s components to be started by the reconciler")


def launched(client: TestClient, name: str) -> bool:
    """Not a ghost: the job ended, or the reconciler saw at least one of its components started."""
    native = client.get(f"/v1/jobs/{name}", headers=AUTH).json()
    return native["status"] != "InProgress" or any(c["state"] != "Pending" for c in native["components"])
