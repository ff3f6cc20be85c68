"""The compose stack (docker-compose.yml at the repository root) brought up for the e2e tests.

Each test session runs its own compose project (``tge2e-<random>``) on free loopback ports and its
own network, so it never touches a stack a developer has running. Teardown removes every job the
tests started (containers and volumes, by label) and the project (``down -v``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

from tests.e2e.docker_env import (
    REPO,
    SERVICE_IMAGE,
    TRAINING_IMAGE,
    compose_available,
    docker_client,
    require_image,
    unavailable,
)
from tests.polling import wait_for  # the tests here import it from this module too

TOKEN = "e2e-" + uuid.uuid4().hex
# The stack has no default secrets: the tests make their own, as infra/make_env.sh does for users.
SAGEMAKER_KEY_ID = "AKTGE2E" + uuid.uuid4().hex[:12].upper()
SAGEMAKER_SECRET = "e2e-secret-" + uuid.uuid4().hex
S3_KEY_ID, S3_SECRET = "AKTGS3" + uuid.uuid4().hex[:12].upper(), "s3-secret-" + uuid.uuid4().hex
DEMO = ["python", "train_demo.py"]  # baked into trainguard-training:local (containers/training/examples)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Stack:
    def __init__(self) -> None:
        self.project = f"tge2e-{uuid.uuid4().hex[:6]}"
        self.api_port = free_port()
        self.s3_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.s3_url = f"http://127.0.0.1:{self.s3_port}"
        self.environment = {
            **os.environ,
            "TRAINGUARD_API_TOKEN": TOKEN,
            "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": f"e2e={SAGEMAKER_KEY_ID}:{SAGEMAKER_SECRET}",
            "AWS_ACCESS_KEY_ID": S3_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "TRAINGUARD_DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid) if os.path.exists("/var/run/docker.sock") else "0",
            "TRAINGUARD_API_PORT": str(self.api_port),
            "TRAINGUARD_S3_PORT": str(self.s3_port),
            "TRAINGUARD_NETWORK": f"{self.project}-net",
            "TRAINGUARD_STOP_GRACE_SECONDS": "10",
            "TRAINGUARD_SMTP_HOST": "smtp",  # the stack's optional SMTP sink (profile "mail")
        }
        self.jobs: list[str] = []
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- compose --------------------------------------------------------------------------------
    def compose(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", "compose", "-p", self.project, "--profile", "mail", *args],
            cwd=REPO, env=self.environment, capture_output=True, text=True, timeout=timeout_s,
        )
        if result.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def up(self) -> None:
        self.compose("up", "-d", "--wait")

    def down(self) -> None:
        from trainguard.services.launchers.docker import DockerLauncher

        launcher = DockerLauncher()
        for job in self.jobs:
            try:
                launcher.remove(job)
            except Exception:  # noqa: BLE001 - teardown goes on; the engine may already be gone
                pass
        subprocess.run(["docker", "compose", "-p", self.project, "--profile", "mail", "down", "-v", "--timeout", "5"],
                       cwd=REPO, env=self.environment, capture_output=True, timeout=120)  # fmt: skip

    # -- API ------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=30) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.jobs.append(spec["name"])
        status, body = self.request("POST", "/v1/jobs", spec)
        assert status == 201, (status, body)
        return body

    def job(self, name: str) -> dict[str, Any]:
        status, body = self.request("GET", f"/v1/jobs/{name}")
        assert status == 200, (status, body)
        return body

    def wait_settled(self, name: str, timeout_s: float = 180) -> dict[str, Any]:
        """Until the job ended and none of its rules is still InProgress/Stopping."""

        def settled() -> dict[str, Any] | None:
            job = self.job(name)
            rules_done = all(r["status"] not in ("InProgress", "Stopping") for r in job.get("rules", []))
            return job if job["status"] in ("Completed", "Failed", "Stopped") and rules_done else None

        try:
            return wait_for(settled, timeout_s, f"job {name} to end")
        except AssertionError:
            description = json.dumps(self.job(name))[:3000]
            raise AssertionError(f"job {name} did not end: {description}\n{self.logs(name)}") from None

    def logs(self, name: str, component: str = "training") -> str:
        path = f"/v1/jobs/{name}/logs?component={urllib.request.quote(component)}"
        return str(self.request("GET", path)[1])

    def sagemaker(self):  # noqa: ANN201 - botocore client
        import boto3

        # The SageMaker endpoint verifies SigV4 with its own key pair (never the API token).
        session = boto3.session.Session(
            aws_access_key_id=SAGEMAKER_KEY_ID, aws_secret_access_key=SAGEMAKER_SECRET, region_name="us-east-1"
        )
        return session.client("sagemaker", endpoint_url=self.url)

    def s3(self):  # noqa: ANN201 - botocore client
        import boto3

        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        return session.client("s3", endpoint_url=self.s3_url)

    def s3_objects(self, prefix: str, bucket: str = "trainguard") -> dict[str, dict[str, Any]]:
        """key (relative to prefix) -> {size, etag} of every object under s3://bucket/prefix/."""
        client = self.s3()
        try:
            paginator = client.get_paginator("list_objects_v2")
            pages = list(paginator.paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"))
        except client.exceptions.NoSuchBucket:
            return {}
        return {
            obj["Key"][len(prefix.rstrip("/")) + 1 :]: {"size": obj["Size"], "etag": obj["ETag"].strip('"')}
            for page in pages
            for obj in page.get("Contents", [])
        }


def job_spec(
    name: str, *, lr: float, steps: int, step_sleep: float = 0.05, stop: bool = True, email: str | None = None
) -> dict[str, Any]:
    """A native job spec running the demo script with ExplodingTensor watching it."""
    actions: list[dict[str, Any]] = [{"name": "stoptraining"}] if stop else []
    if email:
        actions.append({"name": "email", "endpoint": email})
    return {
        "name": name,
        "command": [*DEMO, "--lr", str(lr), "--steps", str(steps), "--step-sleep", str(step_sleep)],
        "hook_config": {"HookParameters": {"save_interval": "1"}},
        "resources": {"cpus": 1.0, "memory_mb": 2048},
        "rules": [
            {"rule": "ExplodingTensor", "actions": actions},
        ],
    }


def volume_files(volume: str) -> dict[str, dict[str, Any]]:
    """relative path -> {size, etag (md5)} of every non-hidden file in a job's tensor volume."""
    from tests.e2e.docker_env import BASE_IMAGE

    script = "cd /t && find . -type f ! -path '*/.*' -printf '%P\\t%s\\t' -exec md5sum {} \\; "
    result = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{volume}:/t:ro", BASE_IMAGE, "bash", "-c", script],
        capture_output=True, text=True, timeout=60, check=True,
    )
    files = {}
    for line in result.stdout.splitlines():
        path, size, rest = line.split("\t", 2)
        files[path] = {"size": int(size), "etag": rest.split()[0]}
    return files


def running_stack() -> Iterator[Stack]:
    """The stack up for one test module (a module-scoped fixture yields from this), down after
    it; the module is skipped with the reason when Docker, Compose or an image is missing."""
    client = docker_client()
    if not compose_available():
        unavailable("docker compose v2 is missing; as root: bash infra/setup_docker.sh")
    require_image(client, TRAINING_IMAGE, "infra/build_images.sh")
    require_image(client, SERVICE_IMAGE, "infra/build_images.sh")
    client.close()
    running = Stack()
    try:
        running.up()
        yield running
    finally:
        running.down()
