"""Native REST validation and authentication (FastAPI's TestClient: pure request handling).

Jobs that are actually run are in the uvicorn-subprocess tests; here only specs that are refused
before anything starts, and the auth rules, so no process is launched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.services.conftest import CUSTOM_RULE, REPO, TOKEN

pytest.importorskip("httpx", reason="TestClient needs httpx")
from fastapi.testclient import TestClient  # noqa: E402

from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path: Path):
    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_RULE_MODULES": "tests.services.rules_for_tests"}  # the custom rules the tests use
    )  # fmt: skip
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _errors(response) -> list[tuple[list, str]]:
    assert response.status_code == 422, response.text
    return [(item["loc"], item["msg"]) for item in response.json()["detail"]]


def test_health_needs_no_token_and_everything_else_does(client) -> None:
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer wrong-token-xyz"}).status_code == 401
    assert client.get("/v1/jobs/x").status_code == 401
    assert client.post("/v1/jobs/x/stop").status_code == 401
    assert client.post("/v1/internal/jobs/x/rules/y/status", json={}).status_code == 401
    assert client.get("/v1/jobs", headers=AUTH).json() == {"jobs": []}
    openapi = client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{name}", "/v1/jobs/{name}/stop", "/v1/jobs/{name}/logs", "/"} <= set(openapi["paths"])


def test_unknown_rule_is_422_listing_valid_rules(client) -> None:
    response = client.post(
        "/v1/jobs", headers=AUTH, json={"name": "a", "command": ["true"], "rules": [{"rule": "NoSuchRule"}]}
    )
    [(location, message)] = _errors(response)
    assert location[:3] == ["body", "rules", 0]
    assert "unknown rule 'NoSuchRule'" in message and "Built-in rules:" in message and "module:ClassName" in message


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"name": "bad_name!", "command": ["true"]}, "name", "pattern"),
        (
            {"name": "a", "command": ["true"], "rules": [{"rule": CUSTOM_RULE, "parameters": {"threshold": "high"}}]},
            "rules",
            "threshold",
        ),
        (
            {"name": "a", "command": ["true"], "rules": [{"rule": CUSTOM_RULE, "parameters": {"nonsense": "1"}}]},
            "rules",
            "nonsense",
        ),
        (
            {"name": "a", "command": ["true"], "rules": [{"rule": CUSTOM_RULE, "actions": [{"name": "fax"}]}]},
            "rules",
            "fax",
        ),
        (
            {"name": "a", "command": ["true"], "rules": [{"rule": CUSTOM_RULE, "actions": [{"name": "webhook"}]}]},
            "rules",
            "url",
        ),
        (
            {"name": "a", "command": ["true"], "rules": [{"rule": CUSTOM_RULE}, {"rule": CUSTOM_RULE}]},
            "body",
            "two rule",
        ),
        (
            {"name": "a", "command": ["true"], "hook_config": {"HookParameters": {"save_intervall": "1"}}},
            "hook_config",
            "save_intervall",
        ),
        ({"name": "a", "command": ["true"], "resources": {"cpus": -1}}, "resources", "greater than 0"),
        (
            {"name": "a", "command": ["true"], "stopping_condition": {"max_runtime_seconds": 0}},
            "stopping_condition",
            "greater than 0",
        ),
        (
            {"name": "a", "command": ["true"], "alarms": [{"name": "x", "rule": "Missing"}]},
            "body",
            "not among the job's rules",
        ),
        (
            {
                "name": "a",
                "command": ["true"],
                "alarms": [{"name": "x", "evaluation_periods": 2, "datapoints_to_alarm": 3}],
            },
            "alarms",
            "exceeds",
        ),
        ({"name": "a", "command": ["true"], "unknown_field": 1}, "unknown_field", "Extra inputs"),
        ({"name": "a"}, "command", "local launcher runs a command"),
    ],
)
def test_invalid_specs_name_the_field(client, body, field, words) -> None:
    errors = _errors(client.post("/v1/jobs", headers=AUTH, json=body))
    assert any(field in [str(part) for part in location] and words in message for location, message in errors), errors


def test_missing_job_is_404(client) -> None:
    assert client.get("/v1/jobs/nope", headers=AUTH).status_code == 404
    assert client.post("/v1/jobs/nope/stop", headers=AUTH).status_code == 404
    assert "nope" in client.get("/v1/jobs/nope/logs", headers=AUTH).json()["detail"]


def test_server_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TRAINGUARD_DATA_DIR": str(tmp_path)}
    finished = subprocess.run(
        [sys.executable, "-m", "trainguard.services.api"], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 2
    assert "TRAINGUARD_API_TOKEN is not set" in finished.stderr


def test_access_keys_sign_native_requests_and_forgeries_are_refused(tmp_path: Path) -> None:
    """A key signs native requests with SigV4 for 'trainguard'; anything else is 401/403 before a route runs."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    key_id, secret = "AKIDNATIVE000001", "native-secret-0123456789"
    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "local",
         "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": f"carol={key_id}:{secret}"}
    )  # fmt: skip

    def signed(method: str, path: str, body: bytes = b"", *, service: str = "trainguard", key: str = secret) -> dict:
        request = AWSRequest(method=method, url=f"http://testserver{path}", data=body, headers={"Host": "testserver"})
        SigV4Auth(Credentials(key_id, key), service, "us-east-1").add_auth(request)
        return dict(request.headers.items())

    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/jobs", headers=signed("GET", "/v1/jobs")).json() == {"jobs": []}
        body = b'{"name": "carols-job", "command": ["true"]}'
        headers = {**signed("POST", "/v1/jobs", body), "Content-Type": "application/json"}
        created = client.post("/v1/jobs", content=body, headers=headers)
        assert created.status_code == 201 and created.json()["owner"] == "carol", created.text
        # The same signature over another body, another path, another query: refused.
        assert client.post("/v1/jobs", content=body.replace(b"carols", b"other"), headers=headers).status_code == 403
        assert client.get("/v1/jobs/carols-job", headers=signed("GET", "/v1/jobs")).status_code == 403
        assert client.get("/v1/jobs?status=Failed", headers=signed("GET", "/v1/jobs")).status_code == 403
        wrong_secret, wrong_service = signed("GET", "/v1/jobs", key="wrong-secret-0123456789"), signed(
            "GET", "/v1/jobs", service="sagemaker"
        )
        for refused in (wrong_secret, wrong_service):
            answer = client.get("/v1/jobs", headers=refused)
            assert answer.status_code == 403 and "InvalidSignatureException" in answer.json()["detail"]
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {key_id}"}).status_code == 401
        internal = "/v1/internal/jobs/carols-job/rules/x/status"
        headers = {**signed("POST", internal, b"{}"), "Content-Type": "application/json"}
        answer = client.post(internal, content=b"{}", headers=headers)
        assert answer.status_code == 401  # runners' route: never an access key, not even the job owner's
        assert client.post("/v1/jobs/carols-job/stop?grace_seconds=0", headers=AUTH).status_code == 202
