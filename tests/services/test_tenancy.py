"""Tenancy: a job belongs to the key (or token) that created it; keys see and stop only their own
jobs unless the operator's policy file grants more; another tenant's job answers as a missing one.

The end-to-end tests run the real API (uvicorn subprocess, local launcher, real job processes) and
talk to it with real boto3 clients (SageMaker and CloudWatch Logs) and botocore-signed native
requests, one key per tenant. The rest are the policy parser, the schema migration on SQLite and
PostgreSQL, and the rule actions' scope, on real databases and processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from trainguard.services.api.policy import OPERATOR, Caller, PolicyError, TenancyPolicy, parse_tenancy_policy

from tests.services.conftest import TOKEN, wait_for
from tests.services.test_postgres import postgres_url  # noqa: F401  (a fixture, found by name)
from trainguard.errors import ConfigError

KEYS = {
    "alice": ("AKIDALICE00000001", "secret-of-alice-0123456789"),
    "bob": ("AKIDBOB0000000001", "secret-of-bob-0123456789ab"),
    "auditor": ("AKIDAUDITOR000001", "secret-of-auditor-01234567"),
    "admin": ("AKIDADMIN00000001", "secret-of-admin-0123456789"),
}
KEYS_ENV = ",".join(f"{name}={key_id}:{secret}" for name, (key_id, secret) in KEYS.items())
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
LONG = ["sh", "-c", "echo log-line-of-$JOB_OWNER; exec sleep 120"]


# -- clients -----------------------------------------------------------------------------------------
def _client(api, key: str, service: str = "sagemaker"):  # noqa: ANN001, ANN202 - botocore clients
    import boto3

    key_id, secret = KEYS[key]
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name="us-east-1")
    return session.client(service, endpoint_url=api.url)


def _native(api, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:  # noqa: ANN001
    """A native API request signed with ``key`` (SigV4, service 'trainguard')."""
    key_id, secret = KEYS[key]
    return api.signed_request(method, path, body, key_id=key_id, secret=secret)


def _sagemaker_request(name: str, owner: str, command: list[str] = LONG) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::111122223333:role/R",
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "AlgorithmSpecification": {"TrainingImage": "trainguard-training:local", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": command[:1], "ContainerArguments": command[1:]},
        "Environment": {"JOB_OWNER": owner, "SECRET_OF_OWNER": f"{owner}-password"},
    }  # fmt: skip


def _native_spec(name: str, owner: str) -> dict[str, Any]:
    return {"name": name, "command": LONG, "environment": {"JOB_OWNER": owner}}


def _error(call) -> dict[str, str]:  # noqa: ANN001
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]


def _names(pages: list[dict[str, Any]]) -> list[str]:
    return [summary["TrainingJobName"] for page in pages for summary in page["TrainingJobSummaries"]]


def _list_all(client, **filters: Any) -> tuple[list[str], int]:  # noqa: ANN001
    """Every job a client lists, one per page (MaxResults=1); (names, pages)."""
    pages = list(client.get_paginator("list_training_jobs").paginate(PaginationConfig={"PageSize": 1}, **filters))
    return _names(pages), len(pages)


def _operator_status(api, name: str) -> str:  # noqa: ANN001
    return api.job(name)["status"]


@pytest.fixture
def tenants_api(api_factory, s3_endpoint, tmp_path: Path):  # noqa: ANN001, ANN201
    def start(**extra_env: str):  # noqa: ANN202
        from tests.s3_server import s3_client

        client = s3_client(s3_endpoint)
        try:
            client.create_bucket(Bucket="bkt")
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return api_factory(S3_ENDPOINT_URL=s3_endpoint, TRAINGUARD_SAGEMAKER_ACCESS_KEYS=KEYS_ENV, **extra_env)

    return start


# -- two tenants ---------------------------------------------------------------------------------------
def test_two_keys_neither_lists_describes_stops_nor_reads_the_logs_of_the_others_jobs(tenants_api) -> None:
    api = tenants_api()
    alice, bob = _client(api, "alice"), _client(api, "bob")
    for index in range(3):
        alice.create_training_job(**_sagemaker_request(f"alice-{index}", "alice"))
    bob.create_training_job(**_sagemaker_request("bob-sm", "bob"))
    status, created = _native(api, "bob", "POST", "/v1/jobs", _native_spec("bob-native", "bob"))
    assert status == 201 and created["owner"] == "bob", created

    # The operator sees every job and who owns it; each key lists its own, page by page.
    status, listed = api.request("GET", "/v1/jobs")
    owners = {job["name"]: job["owner"] for job in listed["jobs"]}
    assert owners == {"alice-0": "alice", "alice-1": "alice", "alice-2": "alice", "bob-native": "bob", "bob-sm": "bob"}
    assert {name: api.job(name)["owner"] for name in ("alice-0", "bob-sm")} == {"alice-0": "alice", "bob-sm": "bob"}
    names, pages = _list_all(alice)
    assert (sorted(names), pages) == (["alice-0", "alice-1", "alice-2"], 3)
    assert sorted(_list_all(bob)[0]) == ["bob-native", "bob-sm"]
    assert _list_all(alice, NameContains="bob")[0] == [] and _list_all(alice, StatusEquals="InProgress")[0] == names
    status, native_list = _native(api, "alice", "GET", "/v1/jobs?status=InProgress")
    assert status == 200 and sorted(job["name"] for job in native_list["jobs"]) == sorted(names)

    # Another tenant's job answers exactly as a job that does not exist, both ways.
    refusals = 0
    for viewer, client, others in (("alice", alice, ("bob-sm", "bob-native")), ("bob", bob, ("alice-0", "alice-2"))):
        missing = _error(lambda client=client: client.describe_training_job(TrainingJobName="no-such-job"))
        missing_status, missing_body = _native(api, viewer, "GET", "/v1/jobs/no-such-job")

        def as_missing(name: str, status: int = missing_status, body: dict = missing_body) -> tuple[int, dict]:
            return status, {"detail": body["detail"].replace("no-such-job", name)}

        for name in others:
            hidden = _error(lambda client=client, name=name: client.describe_training_job(TrainingJobName=name))
            assert hidden == {**missing, "Message": missing["Message"].replace("no-such-job", name)}
            stop = _error(lambda client=client, name=name: client.stop_training_job(TrainingJobName=name))
            assert stop == {**missing, "Message": missing["Message"].replace("no-such-job", name)}
            for path in (f"/v1/jobs/{name}", f"/v1/jobs/{name}/logs"):
                assert _native(api, viewer, "GET", path) == as_missing(name)
            assert _native(api, viewer, "POST", f"/v1/jobs/{name}/stop") == as_missing(name)
            refusals += 5
    assert refusals == 20
    # Nor its logs: no stream through the Logs API, though its owner reads it.
    logs_of = {key: _client(api, key, "logs") for key in ("alice", "bob")}
    for owner, job, viewer in (("bob", "bob-sm", "alice"), ("alice", "alice-1", "bob")):

        def own_stream(owner: str = owner, job: str = job) -> str | None:
            streams = logs_of[owner].describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/")
            return (streams["logStreams"] or [{}])[0].get("logStreamName")

        stream = wait_for(own_stream, 60, f"{job} to have a log stream")
        wait_for(
            lambda owner=owner, stream=stream: f"log-line-of-{owner}" in str(
                logs_of[owner].get_log_events(logGroupName=LOG_GROUP, logStreamName=stream)),
            60, f"{job} to log",
        )  # fmt: skip
        streams = logs_of[viewer].describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/")
        assert streams["logStreams"] == []
        refused = _error(lambda viewer=viewer, stream=stream: logs_of[viewer].get_log_events(
            logGroupName=LOG_GROUP, logStreamName=stream))  # fmt: skip
        assert refused["Code"] == "ResourceNotFoundException"
    wait_for(lambda: "log-line-of-bob" in _native(api, "bob", "GET", "/v1/jobs/bob-native/logs")[1], 60,
             "bob's native job to log")  # fmt: skip
    # Keys never reach the runners' internal route, not even for their own jobs.
    for name in ("alice-0", "bob-sm"):
        assert _native(api, "alice", "POST", f"/v1/internal/jobs/{name}/rules/x/status", {"status": "Error"})[0] == 401

    # Nothing alice tried touched bob's jobs; bob's own stop works, and a second stop of the ended
    # job is AWS's ValidationException.
    assert {_operator_status(api, name) for name in ("bob-sm", "bob-native")} == {"InProgress"}
    description = bob.describe_training_job(TrainingJobName="bob-sm")
    assert description["Environment"]["SECRET_OF_OWNER"] == "bob-password"
    bob.stop_training_job(TrainingJobName="bob-sm")
    wait_for(lambda: _operator_status(api, "bob-sm") == "Stopped", 60, "bob's job to stop")
    assert _error(lambda: bob.stop_training_job(TrainingJobName="bob-sm"))["Code"] == "ValidationException"
    for name in ("alice-0", "alice-1", "alice-2", "bob-native"):
        api.request("POST", f"/v1/jobs/{name}/stop?grace_seconds=0")


def test_the_operators_policy_grants_reading_and_stopping_other_keys_jobs(tenants_api, tmp_path: Path) -> None:
    policy = tmp_path / "tenancy.yaml"
    policy.write_text("grants:\n  - key: auditor\n    read: [alice]\n  - key: admin\n    stop: ['*']\n")
    policy.chmod(0o644)
    api = tenants_api(TRAINGUARD_TENANCY_POLICY_FILE=str(policy))
    alice, bob = _client(api, "alice"), _client(api, "bob")
    auditor, admin = _client(api, "auditor"), _client(api, "admin")
    alice.create_training_job(**_sagemaker_request("alice-job", "alice"))
    bob.create_training_job(**_sagemaker_request("bob-job", "bob"))
    status, _ = api.request("POST", "/v1/jobs", _native_spec("operator-job", "operator"))
    assert status == 201

    # read: [alice] -> alice's jobs only, and no stop.
    assert _list_all(auditor)[0] == ["alice-job"]
    assert auditor.describe_training_job(TrainingJobName="alice-job")["TrainingJobStatus"] == "InProgress"
    assert _native(api, "auditor", "GET", "/v1/jobs/alice-job")[0] == 200
    for name in ("bob-job", "operator-job"):
        refused = _error(lambda name=name: auditor.describe_training_job(TrainingJobName=name))
        assert refused["Code"] == "ResourceNotFound"
    assert _error(lambda: auditor.stop_training_job(TrainingJobName="alice-job"))["Code"] == "AccessDeniedException"
    assert _native(api, "auditor", "POST", "/v1/jobs/alice-job/stop")[0] == 403
    # stop: ['*'] -> every job, the operator's included (whoever may stop a job may see it).
    assert sorted(_list_all(admin)[0]) == ["alice-job", "bob-job", "operator-job"]
    admin.stop_training_job(TrainingJobName="bob-job")
    status, stopped = _native(api, "admin", "POST", "/v1/jobs/operator-job/stop?grace_seconds=0")
    assert status == 202 and stopped["stopping"] is True
    wait_for(lambda: _operator_status(api, "bob-job") == "Stopped", 60, "the admin's stop of bob's job")
    # Without a grant, bob still sees only his own.
    assert _list_all(bob)[0] == ["bob-job"]

    # The file is re-read when it changes: the auditor's grant is gone at the next request.
    policy.write_text("grants:\n  - key: admin\n    stop: ['*']\n    read: []\n")
    assert _list_all(auditor)[0] == []
    assert _error(lambda: auditor.describe_training_job(TrainingJobName="alice-job"))["Code"] == "ResourceNotFound"
    # A broken edit leaves no grants (least privilege), never more than the file said.
    policy.write_text("grants: [ {key: admin, stop: ['*']\n")
    assert _list_all(admin)[0] == []
    api.request("POST", "/v1/jobs/alice-job/stop?grace_seconds=0")


# -- the policy file ---------------------------------------------------------------------------------
def test_policy_grants_and_their_defaults() -> None:
    grants = parse_tenancy_policy(
        {"grants": [{"key": "ci", "read": ["alice", "bob"], "stop": ["alice"]}, {"key": "audit", "read": ["*"]},
                    {"key": "ci", "read": ["carol"]}]},  # fmt: skip
        "test",
    )
    policy = TenancyPolicy(grants)
    ci, audit, alice = Caller("ci"), Caller("audit"), Caller("alice")
    assert policy.owners(ci, "read") == {"ci", "alice", "bob", "carol"} and policy.owners(ci, "stop") == {"ci", "alice"}
    assert policy.owners(audit, "read") is None and policy.owners(audit, "stop") == {"audit"}
    assert policy.owners(Caller(OPERATOR), "stop") is None
    assert policy.allows(alice, "read", "alice") and policy.allows(alice, "stop", "alice")
    assert not policy.allows(alice, "read", "bob") and not policy.allows(alice, "read", None)  # None: the operator's
    assert policy.allows(audit, "read", None) and not policy.allows(audit, "stop", "bob")
    assert TenancyPolicy().owners(alice) == {"alice"}


@pytest.mark.parametrize(
    "text, words",
    [
        ("grants: {key: a}", "'grants' must be a list"),
        ("grants:\n  - read: [b]", "needs 'key'"),
        ("grants:\n  - key: a\n    read: b", "expected a list of key names"),
        ("grants:\n  - key: a\n    write: [b]", "unknown member(s) write"),
        ("grants:\n  - key: operator\n    read: [b]", "operator sees every job"),
        ("grant: []", "one member, 'grants'"),
        ("grants: [", "not YAML or JSON"),
    ],
)
def test_a_bad_policy_file_stops_the_start_naming_the_problem(tmp_path: Path, text: str, words: str) -> None:
    from trainguard.services.api.settings import Settings

    path = tmp_path / "policy.yaml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="TRAINGUARD_TENANCY_POLICY_FILE") as refused:
        Settings.from_env({"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_TENANCY_POLICY_FILE": str(path)})
    assert words in str(refused.value)


def test_a_policy_file_others_may_write_or_that_is_missing_is_refused(tmp_path: Path) -> None:
    from trainguard.services.api.settings import Settings

    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"grants": [{"key": "a", "read": ["*"]}]}))
    path.chmod(0o666)
    environ = {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_TENANCY_POLICY_FILE": str(path)}
    with pytest.raises(ConfigError, match="writable by others"):
        Settings.from_env(environ)
    path.chmod(0o644)
    assert Settings.from_env(environ).tenancy.owners(Caller("a")) is None  # JSON is YAML too
    with pytest.raises(ConfigError, match="No such file"):
        Settings.from_env({**environ, "TRAINGUARD_TENANCY_POLICY_FILE": str(tmp_path / "none.yaml")})
    with pytest.raises(PolicyError):
        parse_tenancy_policy(["not", "a", "mapping"], "test")


def test_a_key_may_not_be_named_operator() -> None:
    from trainguard.services.api.access_keys import parse_access_keys

    with pytest.raises(ConfigError, match="reserved"):
        parse_access_keys("operator=AKIDOPERATOR0001:secret-0123456789abcdef", "test")
    with pytest.raises(ConfigError, match="reserved"):
        parse_access_keys("operator:secret-0123456789abcdef", "test")  # unnamed: its key id is its name


# -- databases from before tenancy ------------------------------------------------------------------
def _database_without_owner(url: str) -> None:
    """A database as the API before tenancy made it: the jobs table without the owner column, one job."""
    import sqlalchemy
    from trainguard.services.api.db import Base, JobRow, make_engine

    engine = make_engine(url)
    Base.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            sqlalchemy.insert(JobRow.__table__).values(
                name="old-job", arn="arn:aws:sagemaker:us-east-1:000000000000:training-job/old-job", source="native",
                spec={"name": "old-job"}, request=None, launcher="local", runner_token="t", status="Completed",
                secondary_status="Completed", failure_reason="", creation_time=1.0, last_modified_time=2.0,
                stop_status="", stop_cause="", settled=True, owner="x",
            )
        )  # fmt: skip
        connection.exec_driver_sql("DROP INDEX ix_jobs_owner")
        connection.exec_driver_sql("ALTER TABLE jobs DROP COLUMN owner")
    assert "owner" not in {c["name"] for c in sqlalchemy.inspect(engine).get_columns("jobs")}
    engine.dispose()


def _check_migrated(url: str) -> None:
    import sqlalchemy
    from trainguard.services.api.db import JobRow, make_engine, make_session_factory

    engine = make_engine(url)
    sessions = make_session_factory(engine)
    make_session_factory(engine)  # a second start (or a second API process) finds it migrated
    with sessions() as session:
        assert session.get(JobRow, "old-job").owner == OPERATOR
    assert "ix_jobs_owner" in {index["name"] for index in sqlalchemy.inspect(engine).get_indexes("jobs")}
    engine.dispose()


def test_a_sqlite_database_from_before_tenancy_is_migrated_and_its_jobs_are_the_operators(tmp_path: Path) -> None:
    pytest.importorskip("httpx", reason="TestClient needs httpx")
    from fastapi.testclient import TestClient
    from trainguard.services.api.app import create_app
    from trainguard.services.api.settings import Settings

    url = f"sqlite:///{tmp_path / 'old.db'}"
    _database_without_owner(url)
    _check_migrated(url)
    settings = Settings.from_env({
        "TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path / "data"), "TRAINGUARD_LAUNCHER": "local",
        "TRAINGUARD_DATABASE_URL": url, "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": KEYS_ENV,
    })  # fmt: skip
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/jobs/old-job", headers={"Authorization": f"Bearer {TOKEN}"}).json()["owner"] == OPERATOR
        service = client.app.state.service
        assert [job.name for job in service.list_jobs(caller=Caller("alice"))] == []
        assert [job.name for job in service.list_jobs()] == ["old-job"]


@pytest.mark.slow
def test_a_postgres_database_from_before_tenancy_is_migrated(postgres_url: str) -> None:  # noqa: F811 - the fixture
    _database_without_owner(postgres_url)
    _check_migrated(postgres_url)


# -- rule actions act for the job's owner ---------------------------------------------------------------
def test_a_stoptraining_prefix_matches_only_jobs_the_owner_may_stop(tmp_path: Path) -> None:
    pytest.importorskip("httpx", reason="TestClient needs httpx")
    from fastapi.testclient import TestClient
    from trainguard.services.actions import get_handler
    from trainguard.services.api.app import create_app
    from trainguard.services.api.schemas import JobSpec
    from trainguard.services.api.settings import Settings

    settings = Settings.from_env({
        "TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
        "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": KEYS_ENV, "TRAINGUARD_STOP_GRACE_SECONDS": "0",
    })  # fmt: skip
    with TestClient(create_app(settings)) as client:
        service = client.app.state.service
        for name, owner in (("train-alice", "alice"), ("train-bob", "bob")):
            service.create(JobSpec.model_validate({"name": name, "command": ["sleep", "60"]}), owner=Caller(owner))
        try:
            context = service.actions.context("train-alice")
            assert context.in_progress_jobs() == ["train-alice"]
            event = {"trainguard": {"finding": {"certain": True}}, "detail": {"TrainingJobName": "train-alice"}}
            # "train-b" matches bob's job, which alice's rule may not stop: no match, nothing stopped.
            answer = get_handler("stoptraining")(event, {"name": "stoptraining", "training_job_prefix": "train-b"},
                                                 context)  # fmt: skip
            assert answer.startswith("not stopped: 0 InProgress jobs")
            assert service.job_for(Caller(OPERATOR), "train-bob").status == "InProgress"
            assert sorted(service.actions.context("train-bob").in_progress_jobs()) == ["train-bob"]
            operator_context = service.actions.context  # the operator's jobs' actions still see every job
            service.create(JobSpec.model_validate({"name": "train-op", "command": ["sleep", "60"]}))
            assert sorted(operator_context("train-op").in_progress_jobs()) == ["train-alice", "train-bob", "train-op"]
        finally:
            def running(name: str) -> bool:
                return all(c["state"] != "Pending" for c in service.describe(name)["components"])

            for job in service.list_jobs():
                wait_for(lambda name=job.name: running(name), 30, f"{job.name} to start")
                service.stop(job.name, 0)
            wait_for(lambda: all(j.status == "Stopped" for j in service.list_jobs()), 30, "the jobs to stop")

