"""The compose stack, probed as an attacker: real engine, real images, nothing mocked.

* no secret has a default: compose refuses to start without each one;
* no container of the stack or of a job runs as root; all drop every capability;
* only the Docker proxy holds the socket; from inside the API container, a container with the
  host's ``/`` mounted is refused;
* a container on the jobs network reaches neither the Docker proxy nor moto's admin routes, and the
  API answers it 401 without a token;
* the SageMaker endpoint in the container verifies SigV4 (a forged key is refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.docker_env import (
    BASE_IMAGE,
    SERVICE_IMAGE,
    compose_available,
    docker_client,
    unavailable,
)
from tests.e2e.stack import REPO, Stack, running_stack

pytestmark = pytest.mark.slow
UNPRIVILEGED = "10001"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from running_stack()


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _project_containers(stack: Stack) -> dict[str, dict]:
    """service name -> docker inspect of the stack's running containers."""
    ids = _docker("ps", "-q", "--filter", f"label=com.docker.compose.project={stack.project}").stdout.split()
    inspected = json.loads(_docker("inspect", *ids).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in inspected}


def test_compose_refuses_to_start_without_each_secret() -> None:
    if not compose_available():
        unavailable("docker compose v2 is missing")
    complete = {
        "TRAINGUARD_API_TOKEN": "t" * 32,
        "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": "AKTGEXAMPLE0001:" + "s" * 32,
        "AWS_ACCESS_KEY_ID": "AKTGS3EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "x" * 32,
        "TRAINGUARD_DOCKER_GID": "0",
    }
    base = {k: v for k, v in os.environ.items() if k not in complete and not k.startswith("TRAINGUARD_")}
    command = ["docker", "compose", "--env-file", "/dev/null", "-p", "tgsecrets", "config", "--quiet"]
    ok = subprocess.run(command, cwd=REPO, env={**base, **complete}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    for missing in complete:
        environment = {**base, **{k: v for k, v in complete.items() if k != missing}}
        result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
        assert result.returncode != 0 and missing in result.stderr, (missing, result.stderr)
    config = subprocess.run(["docker", "compose", "--env-file", "/dev/null", "-p", "tgsecrets", "config"], cwd=REPO,
                            env={**base, **complete}, capture_output=True, text=True).stdout  # fmt: skip
    assert "ALLOW_ANY_SIGNATURE" not in config and "testing" not in config


def test_stack_containers_are_unprivileged_and_only_the_proxy_holds_the_socket(stack) -> None:  # noqa: ANN001
    containers = _project_containers(stack)
    assert {"api", "s3", "docker-proxy"} <= set(containers)
    for service, info in containers.items():
        host = info["HostConfig"]
        assert info["Config"]["User"].split(":")[0] == UNPRIVILEGED, service
        assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd"), service
        assert any(o.startswith("no-new-privileges") for o in host["SecurityOpt"]), service
        assert host["ReadonlyRootfs"] is True and host["Privileged"] is False, service
        uid = _docker("exec", info["Id"], "id", "-u").stdout.strip()
        assert uid == UNPRIVILEGED, (service, uid)
        sockets = [m for m in info["Mounts"] if m.get("Source") == "/var/run/docker.sock"]
        assert bool(sockets) == (service == "docker-proxy"), service
    api = containers["api"]["Id"]
    assert _docker("exec", api, "test", "-e", "/var/run/docker.sock").returncode != 0
    # The API's state is private to its user.
    mode = _docker("exec", api, "stat", "-c", "%a %u", "/data", "/data/trainguard.db").stdout.split("\n")
    assert mode[0] == f"700 {UNPRIVILEGED}" and mode[1] == f"600 {UNPRIVILEGED}", mode


def test_the_api_container_cannot_start_a_container_with_the_host_root_mounted(stack) -> None:  # noqa: ANN001
    api = _project_containers(stack)["api"]["Id"]
    attempt = f"""
import docker
client = docker.from_env()
try:
    client.containers.create({BASE_IMAGE!r}, ["cat", "/host/etc/shadow"], volumes={{"/": {{"bind": "/host"}}}},
                             labels={{"trainguard.job": "evil"}}, cap_drop=["ALL"], security_opt=["no-new-privileges"])
    print("CREATED")
except docker.errors.APIError as error:
    print("REFUSED", error.response.status_code, error.explanation)
try:
    client.containers.create({BASE_IMAGE!r}, ["true"], privileged=True, labels={{"trainguard.job": "evil"}})
    print("CREATED")
except docker.errors.APIError as error:
    print("REFUSED", error.response.status_code, error.explanation)
"""
    result = _docker("exec", api, "python", "-c", attempt)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("REFUSED 403") for line in lines), result.stdout + result.stderr
    assert "bind mount of host path '/'" in lines[0] and "privileged" in lines[1]
    assert not docker_client().containers.list(all=True, filters={"label": "trainguard.job=evil"})


def test_a_job_network_container_reaches_neither_the_proxy_nor_admin_routes(stack) -> None:  # noqa: ANN001
    probe = """
import socket, urllib.request, urllib.error
def status(url):
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__
try:
    socket.create_connection(("docker-proxy", 2375), timeout=5).close()
    print("proxy", "REACHED")
except OSError as error:
    print("proxy", type(error).__name__)
print("moto-admin", status("http://s3:5000/moto-api/data.json"))
print("s3", status("http://s3:5000/"))
print("api-jobs", status("http://api:8080/v1/jobs"))
"""
    result = _docker(
        "run", "--rm", "--network", stack.environment["TRAINGUARD_NETWORK"], "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", SERVICE_IMAGE, "python", "-c", probe,
    )  # fmt: skip
    answers = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert answers["proxy"] != "REACHED", result.stdout + result.stderr
    assert answers["moto-admin"] == "403" and answers["s3"] == "200"
    assert answers["api-jobs"] == "401"


def test_a_job_runs_unprivileged_and_sigv4_is_verified(stack) -> None:  # noqa: ANN001
    import boto3
    from botocore.exceptions import ClientError

    forged = boto3.session.Session(aws_access_key_id="ANYTHING0000", aws_secret_access_key="x" * 20,
                                   region_name="us-east-1").client("sagemaker", endpoint_url=stack.url)  # fmt: skip
    with pytest.raises(ClientError) as refused:
        forged.list_training_jobs()
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException"
    assert stack.sagemaker().list_training_jobs()["TrainingJobSummaries"] is not None

    name = f"e2e-uid-{uuid.uuid4().hex[:6]}"
    stack.submit({"name": name, "command": ["python", "-c", "import os; print('running as uid', os.getuid())"],
                  "resources": {"cpus": 0.5, "memory_mb": 512}})  # fmt: skip
    job = stack.wait_settled(name, timeout_s=180)
    assert job["status"] == "Completed", (job.get("failure_reason"), stack.logs(name), stack.logs(name, "uploader"))
    assert f"running as uid {UNPRIVILEGED}" in stack.logs(name)
    for container in docker_client().containers.list(all=True, filters={"label": f"trainguard.job={name}"}):
        host = container.attrs["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"], container.name
        assert container.attrs["Config"]["User"].split(":")[0] == UNPRIVILEGED, container.name


def test_a_job_image_that_runs_as_root_is_refused(stack) -> None:  # noqa: ANN001
    name = f"e2e-root-{uuid.uuid4().hex[:6]}"
    stack.jobs.append(name)
    status, body = stack.request("POST", "/v1/jobs", {"name": name, "image": BASE_IMAGE, "command": ["id", "-u"]})
    if status == 201:  # accepted, then failed at launch: the reason must say why
        job = stack.wait_settled(name, timeout_s=120)
        assert job["status"] == "Failed" and "root" in str(job.get("failure_reason")), job
    else:
        assert 400 <= status < 500 and "root" in json.dumps(body), (status, body)
    assert not docker_client().containers.list(all=True, filters={"label": f"trainguard.job={name}"})
