"""schemathesis against the native API's own OpenAPI schema: no 5xx, and no half-created job.

Bounded (a fixed number of examples per operation, derandomized; ``TRAINGUARD_FUZZ_EXAMPLES``
raises it) so that it runs in seconds here;
both valid and schema-violating data are generated. The app runs in-process with the real local
launcher: a generated spec that is valid starts a job, so a generated command that would run is
swapped for a harmless one (the fuzzing is about the API, not about running random programs).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from tests.services.conftest import TOKEN, wait_for

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis")
pytest.importorskip("httpx", reason="TestClient needs httpx")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HARMLESS = [sys.executable, "-c", "pass"]
EXAMPLES = int(os.environ.get("TRAINGUARD_FUZZ_EXAMPLES", "40"))  # per operation; longer runs: raise it
SEEN: dict[int, int] = {}  # status code -> how many answers (the fuzz must reach both 2xx and 4xx)


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - the FastAPI app
    data_dir = tmp_path_factory.mktemp("fuzz-native")
    app = create_app(
        Settings.from_env(
            {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(data_dir), "TRAINGUARD_LAUNCHER": "local",
             "TRAINGUARD_RECONCILE_INTERVAL": "0.2", "TRAINGUARD_STOP_GRACE_SECONDS": "1"}
        )  # fmt: skip
    )
    with TestClient(app) as client:  # runs the lifespan: reconciler and action pool, as in production
        app.state.fuzz_client = client
        yield app
        for job in client.get("/v1/jobs", headers=AUTH).json()["jobs"]:
            client.post(f"/v1/jobs/{job['name']}/stop?grace_seconds=0", headers=AUTH)


@pytest.fixture(scope="module")
def native_schema(fuzz_app):  # noqa: ANN001, ANN201 - a schemathesis schema
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)

    @schema.hook
    def map_body(context: Any, body: Any) -> Any:
        if isinstance(body, dict) and isinstance(body.get("command"), list) and body["command"]:
            body["command"] = list(HARMLESS)
        return body

    return schema


schema = schemathesis.pytest.from_fixture("native_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
def test_no_server_error(case: Any) -> None:
    response = case.call(headers=AUTH)
    SEEN[response.status_code] = SEEN.get(response.status_code, 0) + 1
    where = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text[:500]}"


def test_after_the_fuzz_every_job_is_whole(fuzz_app) -> None:  # noqa: ANN001
    """Runs after the fuzz (same module app): every job row describes, in both APIs, and was launched."""
    client: TestClient = fuzz_app.state.fuzz_client
    print("answers by status:", dict(sorted(SEEN.items())))
    assert any(code < 300 for code in SEEN) and 422 in SEEN, SEEN  # valid and invalid data were both sent
    listing = client.get("/v1/jobs", headers=AUTH)
    assert listing.status_code == 200
    print("jobs created by the fuzz:", len(listing.json()["jobs"]))
    for job in listing.json()["jobs"]:
        native = client.get(f"/v1/jobs/{job['name']}", headers=AUTH)
        assert native.status_code == 200, native.text

        def launched(name: str = job["name"]) -> bool:
            # A ghost is a row whose components were never started: InProgress with every one Pending.
            description = client.get(f"/v1/jobs/{name}", headers=AUTH).json()
            started = any(c["state"] != "Pending" for c in description["components"])
            return description["status"] != "InProgress" or started

        wait_for(launched, 30, f"{job['name']}'s components to be started by the reconciler")
        sagemaker = client.post(
            "/", json={"TrainingJobName": job["name"]},
            headers={**AUTH, "X-Amz-Target": "SageMaker.DescribeTrainingJob"},
        )  # fmt: skip
        assert sagemaker.status_code == 200, sagemaker.text
