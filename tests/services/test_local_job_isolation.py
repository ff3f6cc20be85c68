"""A job on the local launcher is not the API: the real API as root, real jobs trying what they must not.

A job spec runs ``job_attacks.py``, which tries to read the API token (its environment, the API
process's environment, the credentials file), each key secret (inline and the keys file), the
database (read and write), other jobs' files, and to write outside its own directory (the data
dir, the jobs dir, another job, its launcher's files, the API's working directory, through a
link it makes). Each attempt must fail, and the job must still train, capture and have its rule
evaluated. Relative ``working_dir`` values that leave the job's directory are refused at creation.

The isolation needs root (each job runs as a uid of its own); without it that test skips. The
interpreter must be reachable by an unprivileged uid (tests/services/job_users.py opens closed
parents for traversal while it runs).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.conftest import (
    CUSTOM_RULE,
    HOOK_EVERY_STEP,
    REPO,
    SAGEMAKER_SECRET,
    TOKEN,
    ApiServer,
    s3_endpoint,  # noqa: F401  (a fixture, found by name)
    training_command,
    wait_for,
)
from tests.services.job_users import needs_root, traversable_for_jobs

ATTACKS = Path(__file__).with_name("job_attacks.py")
FILE_KEY_SECRET = "file-key-secret-0123456789abcdef"
API_AWS_SECRET = "the-apis-own-aws-secret-0123456789"
CREDENTIALS_TOKEN = "credentials-file-token-0123456789"


@pytest.fixture
def isolated_api() -> Iterator[ApiServer]:
    with traversable_for_jobs():
        yield from _isolated_api({"AWS_SECRET_ACCESS_KEY": API_AWS_SECRET})


@pytest.fixture
def isolated_sagemaker_api(s3_endpoint: str) -> Iterator[ApiServer]:  # noqa: F811
    from tests.s3_server import s3_client

    client = s3_client(s3_endpoint)
    try:
        client.create_bucket(Bucket="bkt")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    with traversable_for_jobs():
        yield from _isolated_api({"S3_ENDPOINT_URL": s3_endpoint})


def _isolated_api(extra_env: dict[str, str]) -> Iterator[ApiServer]:
    base = Path(tempfile.mkdtemp(prefix="tg-isolation-"))
    os.chmod(base, 0o711)  # the data dir's parent, as /var/lib is
    data_dir = base / "state"
    data_dir.mkdir(mode=0o700)
    keys_file = data_dir / "keys"
    keys_file.write_text(f"alice=AKIATGALICE000000001:{FILE_KEY_SECRET}\n")
    keys_file.chmod(0o600)
    credentials = data_dir / "credentials.json"  # as `trainguard serve` keeps its generated secrets
    credentials.write_text(json.dumps({"api_token": CREDENTIALS_TOKEN}))
    credentials.chmod(0o600)
    server = ApiServer(
        data_dir,
        {
            "TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE": str(keys_file),
            "TRAINGUARD_DATABASE_URL": f"sqlite:///{data_dir / 'trainguard.db'}",
            **extra_env,
        },
    )
    server.log_path = base / "api.log"  # the test's, not the service's state
    try:
        server.start()
        yield server
    finally:
        server.kill()
        from tests.services.conftest import _stop_local_jobs

        _stop_local_jobs(data_dir / "local")
        shutil.rmtree(base, ignore_errors=True)


def _spec(name: str, command: list[str], **extra: object) -> dict:
    return {
        "name": name,
        "command": command,
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": CUSTOM_RULE, "name": "LossWatch", "parameters": {"threshold": 1000}}],
        **extra,
    }


@needs_root
def test_a_job_cannot_reach_the_apis_secrets_nor_write_outside_its_directory(isolated_api: ApiServer) -> None:
    api = isolated_api
    data_dir = api.data_dir
    victim = _spec("victim", training_command("--steps", "400", "--step-seconds", "0.05"))
    status, body = api.request("POST", "/v1/jobs", victim)
    assert status == 201, body
    wait_for(lambda: api.job("victim")["secondary_status"] == "Training", 60, "the other job to train")

    command = [sys.executable, str(ATTACKS), str(data_dir), "victim", "attacker", str(REPO), "--", "--steps", "5"]
    status, body = api.request("POST", "/v1/jobs", _spec("attacker", command, working_dir="sub/dir"))
    assert status == 201, body
    job = wait_for(
        lambda: (j := api.job("attacker"))["status"] != "InProgress" and j["rules"][0]["status"] != "InProgress" and j,
        120, "the attacking job to end",
    )  # fmt: skip
    log = api.request("GET", "/v1/jobs/attacker/logs?component=training")[1]
    assert job["status"] == "Completed", (job, log[-3000:])
    line = next(line for line in log.splitlines() if line.startswith("ATTACKS "))
    report = json.loads(line[len("ATTACKS "):])

    # It ran as a user of its own, in its own directory (the relative working_dir resolved there).
    assert report["uid"] != 0 and report["gid"] != 0 and report["groups"] == [], report
    job_dir = data_dir / "jobs" / "attacker"
    assert report["cwd"] == str(job_dir / "sub" / "dir")
    assert not (REPO / "sub").exists()
    # Nothing of the API's environment: no token, key, database URL or cloud secret.
    environment = report["environment"]
    apis_own = {name for name in api.environment if name.startswith(("TRAINGUARD_", "AWS_", "S3_"))}
    assert apis_own >= {"TRAINGUARD_API_TOKEN", "TRAINGUARD_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"}
    assert not set(environment) & apis_own, sorted(set(environment) & apis_own)
    assert environment["HOME"] == str(job_dir) and environment["TMPDIR"] == str(job_dir / "tmp")
    for secret in (TOKEN, SAGEMAKER_SECRET, FILE_KEY_SECRET, API_AWS_SECRET, CREDENTIALS_TOKEN, "sqlite:///"):
        assert secret not in line, f"the job saw {secret!r}"
    allowed = {"own directory", "home", "tmp"}
    outcomes = report["outcomes"]
    print("\n".join(f"  {name}: {outcome[:100]}" for name, outcome in outcomes.items()))
    refused = {name: outcome for name, outcome in outcomes.items() if name not in allowed}
    assert len(refused) == 17 and all(outcome.startswith("denied: ") for outcome in refused.values()), refused
    assert all(outcomes[name].startswith("GOT: 'wrote ") for name in allowed), outcomes
    for target in (data_dir / "job-was-here", data_dir / "jobs" / "job-was-here",
                   data_dir / "jobs" / "victim" / "job-was-here", REPO / "job-was-here"):  # fmt: skip
        assert not target.exists(), target

    # ... and otherwise ran normally: it captured every step and its rule evaluated them.
    assert job["exit_code"] == 0
    assert job["rules"][0]["status"] == "NoIssuesFound", job["rules"][0]
    assert job["rules"][0]["last_evaluated_step"] == 4
    assert (job_dir / "debug-output" / "training_job_end.ts").exists()
    assert api.job("victim")["status"] == "InProgress"  # the other job went on untouched

    # The API's secrets and state keep modes only their owner passes.
    private = [data_dir, *(data_dir / name for name in ("trainguard.db", "keys", "credentials.json", "local"))]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in private}
    assert modes == {"state": 0o701, "trainguard.db": 0o600, "keys": 0o600, "credentials.json": 0o600, "local": 0o700}
    assert api.request("POST", "/v1/jobs/victim/stop?grace_seconds=2", {})[0] == 202
    wait_for(lambda: api.job("victim")["status"] == "Stopped", 60, "the other job to stop")


def test_a_working_dir_that_leaves_the_job_dir_is_refused_at_creation(api_factory) -> None:  # noqa: ANN001
    # Validation at creation, as root or not: the same checks guard the unisolated service.
    api = api_factory()
    planted = api.data_dir / "jobs" / "leaver"
    planted.mkdir(parents=True)
    (planted / "link-out").symlink_to(REPO)  # a directory left from before, with a link out of it
    for working_dir in ("..", "../victim", "sub/../../x", "/etc", str(REPO), "link-out", "link-out/deeper"):
        status, body = api.request("POST", "/v1/jobs", _spec("leaver", ["true"], working_dir=working_dir))
        assert 400 <= status < 500 and "working_dir" in json.dumps(body), (working_dir, status, body)
        assert api.request("GET", "/v1/jobs/leaver")[0] == 404, working_dir  # nothing half-created
    status, body = api.request("POST", "/v1/jobs", _spec("leaver", ["true"], working_dir="inside/it"))
    assert status == 201, body


def _signed(
    api: ApiServer, key_id: str, secret: str, method: str, path: str, body: object = None
) -> tuple[int, object]:
    """A native API request signed with an access key (SigV4, service 'trainguard')."""
    import urllib.error
    import urllib.request

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Host": api.url.removeprefix("http://"), "Content-Type": "application/json"}
    request = AWSRequest(method=method, url=api.url + path, data=data, headers=headers)
    SigV4Auth(Credentials(key_id, secret), "trainguard", "us-east-1").add_auth(request)
    prepared = urllib.request.Request(api.url + path, data=data or None, method=method, headers=dict(request.headers))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(prepared, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def test_revoking_the_submitting_key_revokes_what_its_job_holds(api_factory, tmp_path: Path) -> None:  # noqa: ANN001
    pytest.importorskip("botocore")
    from trainguard.services.api.access_keys import create_key, revoke_key

    keys_file = tmp_path / "keys"
    carol = create_key(keys_file, "carol")
    create_key(keys_file, "dave")
    api = api_factory(TRAINGUARD_SAGEMAKER_ACCESS_KEYS_FILE=str(keys_file))
    spec = _spec("carols", training_command("--steps", "400", "--step-seconds", "0.05"))
    status, body = _signed(api, carol.key_id, carol.secret, "POST", "/v1/jobs", spec)
    assert status == 201, body
    spec_file = api.data_dir / "local" / "carols" / "rule--LossWatch" / "spec.json"
    wait_for(spec_file.exists, 30, "the rule runner")
    runner_token = json.loads(spec_file.read_text())["environment"]["TRAINGUARD_API_TOKEN"]  # what the job holds
    report = {"configuration_name": "LossWatch", "status": "InProgress", "last_evaluated_step": 0}
    route = "/v1/internal/jobs/carols/rules/LossWatch/status"
    assert api.request("POST", route, report, token=runner_token)[0] == 200

    revoke_key(keys_file, "carol")
    assert api.request("POST", route, report, token=runner_token)[0] == 401  # the job's token went with the key
    assert api.request("POST", route, report)[0] == 200  # the operator's token still reaches the job
    assert _signed(api, carol.key_id, carol.secret, "GET", "/v1/jobs/carols")[0] in (401, 403)
    assert api.request("POST", "/v1/jobs/carols/stop?grace_seconds=2", {})[0] == 202
    wait_for(lambda: api.job("carols")["status"] == "Stopped", 60, "the stop")


@needs_root
@pytest.mark.slow
def test_a_sagemaker_job_runs_as_its_own_user_with_its_uploader_and_contract(
    isolated_sagemaker_api: ApiServer,
) -> None:
    """The SDK's path, isolated: the contract runner, the uploader and the rule runner run as the
    job's user and still do their work (debug output and model on S3, the rule's verdict)."""
    from tests.s3_server import s3_client
    from tests.services.test_sagemaker_endpoint import AWS_RULES_IMAGE, _request

    api = isolated_sagemaker_api
    client = api.sagemaker()
    rules = [{"RuleConfigurationName": "LossBlowup", "RuleEvaluatorImage": AWS_RULES_IMAGE,
              "RuleParameters": {"rule_to_invoke": CUSTOM_RULE, "threshold": "1000.0"}}]  # fmt: skip
    client.create_training_job(**_request("isolated-sm", training_command("--steps", "6"), rules))

    def finished() -> dict | None:
        description = client.describe_training_job(TrainingJobName="isolated-sm")
        statuses = description.get("DebugRuleEvaluationStatuses", [])
        ended = description["TrainingJobStatus"] != "InProgress" and statuses[0]["RuleEvaluationStatus"] != "InProgress"
        return description if ended else None

    description = wait_for(finished, 180, "the job and its rule to finish")
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    assert description["DebugRuleEvaluationStatuses"][0]["RuleEvaluationStatus"] == "NoIssuesFound"
    job_dir = api.data_dir / "jobs" / "isolated-sm"
    owner = job_dir.stat().st_uid
    assert owner != 0 and (job_dir / "debug-output").stat().st_uid == owner
    pages = s3_client(api.environment["S3_ENDPOINT_URL"]).get_paginator("list_objects_v2")
    listing = pages.paginate(Bucket="bkt", Prefix="isolated-sm/")
    keys = {item["Key"] for page in listing for item in page.get("Contents", [])}
    assert "isolated-sm/debug-output/training_job_end.ts" in keys, sorted(keys)
    assert "isolated-sm/output/model.tar.gz" in keys, sorted(keys)


def test_an_api_restart_keeps_the_data_dir_traversable_for_running_jobs(tmp_path: Path) -> None:
    """secure_state makes the data dir 0700 but keeps o+x where the launcher opened it: a restarted
    API must not cut its running jobs off from their directories (they write to absolute paths)."""
    from trainguard.services.api.settings import Settings, secure_state

    umask = os.umask(0o022)
    try:
        for before, after in ((0o701, 0o701), (0o755, 0o701), (0o700, 0o700), (0o770, 0o700)):
            data_dir = tmp_path / f"state-{before:o}"
            data_dir.mkdir()
            data_dir.chmod(before)
            secure_state(Settings(api_token="x" * 16, database_url=f"sqlite:///{data_dir / 'db'}", data_dir=data_dir))
            assert stat.S_IMODE(data_dir.stat().st_mode) == after, oct(before)
    finally:
        os.umask(umask)
