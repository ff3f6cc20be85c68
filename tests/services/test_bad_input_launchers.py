"""What a launcher can run is asked when a job is created; what its engine refuses is the caller's error.

* The Docker launcher takes SageMaker's container paths as ``working_dir`` (``/opt/ml/code``: a
  directory inside the job's container, not on the API's host) and refuses a relative one at
  creation; the local launcher keeps refusing directories outside the job's own.
* A launch the engine refuses because of the request (the job's image missing, a value the engine
  rejects with 400) ends the job Failed with a ``ClientError``, not an ``InternalServerError``.
* A hook config whose ``S3OutputPath`` is not a string is a 422, not a 500 in the Docker plan.

The Docker tests use the real engine and skip where none runs.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.services.conftest import TOKEN

pytest.importorskip("httpx", reason="TestClient needs httpx")
from fastapi.testclient import TestClient  # noqa: E402
from trainguard.services.api.app import create_app  # noqa: E402
from trainguard.services.api.job_creation import check_launchable  # noqa: E402
from trainguard.services.api.schemas import JobSpec  # noqa: E402
from trainguard.services.api.settings import Settings  # noqa: E402
from trainguard.services.launchers.base import (  # noqa: E402
    ComponentSpec,
    JobLaunch,
    LauncherError,
    LauncherSupport,
    LaunchRefused,
    launcher_support,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class _Named:
    """Just what check_launchable asks of a launcher: its name and what it supports."""

    def __init__(self, name: str, support: LauncherSupport | None = None) -> None:
        self.name = name
        if support is not None:
            self.support = support


def test_what_each_launcher_says_it_supports() -> None:
    from trainguard.services.launchers.docker import DockerLauncher
    from trainguard.services.launchers.local import LocalLauncher
    from trainguard.services.launchers.ray import RayLauncher

    assert launcher_support(LocalLauncher) == LauncherSupport(max_instance_count=1, container_paths=False)
    assert launcher_support(DockerLauncher) == LauncherSupport(max_instance_count=1, container_paths=True)
    assert launcher_support(RayLauncher).max_instance_count > 1
    assert launcher_support(object()) == LauncherSupport()  # a back-end that does not say: one, host paths


def test_container_paths_are_absolute_paths_inside_the_container() -> None:
    docker_like = _Named("docker", LauncherSupport(container_paths=True))
    for path in ("/opt/ml/code", "/workspace", "/"):
        check_launchable(JobSpec(name="j", command=["true"], working_dir=path), docker_like)
    for path, why in (("code", "absolute"), ("/opt/ml/../../etc", "'..'"), ("/opt/ml/\ncode", "control")):
        with pytest.raises(ValueError, match=f"^working_dir: .*{why}"):
            check_launchable(JobSpec(name="j", command=["true"], working_dir=path), docker_like)
    many = JobSpec(name="j", command=["true"], resources={"instance_count": 3})
    with pytest.raises(ValueError, match=r"^resources.instance_count: 3 instances.*at most 1"):
        check_launchable(many, _Named("local"))
    check_launchable(many, _Named("ray", LauncherSupport(max_instance_count=64)))


# -- the real engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():  # noqa: ANN201 - a docker.DockerClient
    from tests.e2e.docker_env import BASE_IMAGE, docker_client, require_image

    client = docker_client()
    require_image(client, BASE_IMAGE, "infra/build_base_image.sh")
    yield client
    client.close()


@pytest.fixture
def docker_job(engine):  # noqa: ANN001, ANN201 - (launcher, job name)
    from trainguard.services.launchers.docker import DockerLauncher

    launcher = DockerLauncher(engine)
    name = f"tgtest-{uuid.uuid4().hex[:8]}"
    yield launcher, name
    launcher.remove(name)


def _wait(predicate, timeout_s: float = 60.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout_s} s")


def test_sagemakers_code_directory_is_the_containers_working_directory(docker_job) -> None:  # noqa: ANN001
    from tests.e2e.docker_env import BASE_IMAGE

    launcher, name = docker_job
    component = ComponentSpec("training", BASE_IMAGE, ("sh", "-c", "pwd; touch here && ls"), working_dir="/opt/ml/code")
    launcher.start(JobLaunch(name, (component,)))
    assert _wait(lambda: "here" in launcher.logs(name)), launcher.logs(name)
    assert launcher.logs(name).splitlines()[0] == "/opt/ml/code"


def test_what_the_engine_refuses_of_the_request_is_a_launch_refused(docker_job) -> None:  # noqa: ANN001
    from tests.e2e.docker_env import BASE_IMAGE

    launcher, name = docker_job
    relative = ComponentSpec("training", BASE_IMAGE, ("true",), working_dir="code")
    with pytest.raises(LaunchRefused, match="absolute path"):
        launcher.start(JobLaunch(name, (relative,)))
    missing = f"tg-no-such-image-{uuid.uuid4().hex[:6]}:44"
    with pytest.raises(LaunchRefused, match="image not found"):
        launcher.start(JobLaunch(name, (ComponentSpec("training", missing, ("true",)),)))
    # The service's own images are the operator's to build: not the request's fault.
    with pytest.raises(LauncherError) as service_image:
        launcher.start(JobLaunch(name, (ComponentSpec("uploader", missing, ("true",)),)))
    assert not isinstance(service_image.value, LaunchRefused)
    assert launcher.status(name) == {}  # nothing half-started is left


def _docker_api(tmp_path: Path, engine: Any) -> TestClient:
    from trainguard.services.launchers.docker import DockerLauncher

    settings = Settings.from_env(
        {"TRAINGUARD_API_TOKEN": TOKEN, "TRAINGUARD_DATA_DIR": str(tmp_path), "TRAINGUARD_LAUNCHER": "docker",
         "TRAINGUARD_RECONCILE_INTERVAL": "0.2", "TRAINGUARD_S3_OUTPUT": "s3://bkt/"}
    )  # fmt: skip
    return TestClient(create_app(settings, launcher=DockerLauncher(engine)))


def test_on_the_docker_launcher_bad_specs_are_4xx_and_a_missing_job_image_a_client_error(tmp_path, engine) -> None:  # noqa: ANN001
    name = f"tgtest-{uuid.uuid4().hex[:8]}"
    base = {"name": name, "command": ["python", "train.py"], "image": f"tg-no-such-image-{name}:44"}
    with _docker_api(tmp_path, engine) as client:
        try:
            for members, location in (
                ({"hook_config": {"S3OutputPath": 5}}, ["body", "hook_config"]),
                ({"hook_config": {"S3OutputPath": {"Bucket": "b"}}}, ["body", "hook_config"]),
                ({"working_dir": "code"}, ["body", "working_dir"]),
                ({"resources": {"instance_count": 2}}, ["body", "resources", "instance_count"]),
            ):
                response = client.post("/v1/jobs", headers=AUTH, json={**base, **members})
                assert response.status_code == 422, (members, response.text)
                assert response.json()["detail"][0]["loc"] == location, response.text
            # SageMaker's container path is accepted; the job's own image is missing: ClientError.
            response = client.post("/v1/jobs", headers=AUTH, json={**base, "working_dir": "/opt/ml/code"})
            assert response.status_code == 201, response.text

            def failed() -> dict | None:
                job = client.get(f"/v1/jobs/{name}", headers=AUTH).json()
                return job if job["status"] == "Failed" else None

            job = _wait(failed)
            assert job["failure_reason"].startswith("ClientError: "), job["failure_reason"]
            assert "image not found" in job["failure_reason"]
            described = client.post(
                "/", content=json.dumps({"TrainingJobName": name}),
                headers={**AUTH, "X-Amz-Target": "SageMaker.DescribeTrainingJob"},
            ).json()  # fmt: skip
            assert described["FailureReason"].startswith("ClientError: "), described
        finally:
            client.post(f"/v1/jobs/{name}/stop?grace_seconds=0", headers=AUTH)
            client.app.state.service.launcher.remove(name)
