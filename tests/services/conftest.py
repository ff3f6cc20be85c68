"""Fixtures for the service tests: the real API in a uvicorn subprocess, the real boto3 client.

Nothing is mocked: the API runs as ``python -m trainguard.services.api`` (uvicorn) with the local-process
launcher, jobs run real PyTorch training under ``trainguard run``, rule runners are real
``python -m trainguard.services.rule_runner`` processes reporting over HTTP, and S3/SNS/CloudWatch are the
moto server subprocess from tests/s3_server.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import wait_for  # the tests here import it from this module too
from tests.s3_server import DUMMY_CREDENTIALS, free_port, s3_endpoint  # noqa: F401  (fixture by name)

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789abcdef"
# The SageMaker endpoint's SigV4 credentials: a key pair of its own, never the API token.
SAGEMAKER_KEY_ID = "AKIDTRAINGUARDTEST01"
SAGEMAKER_SECRET = "test-secret-for-sigv4-0123456789"

for _module in ("fastapi", "uvicorn", "sqlalchemy"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"service tests need {_module}: pip install -e '.[service,test]'", allow_module_level=True)


class ApiServer:
    """``python -m trainguard.services.api`` in a subprocess; restartable on the same database."""

    def __init__(self, data_dir: Path, extra_env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = TOKEN
        self.log_path = data_dir / "api.log"
        self.environment = {
            **os.environ,
            **DUMMY_CREDENTIALS,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "TRAINGUARD_API_TOKEN": TOKEN,
            "TRAINGUARD_SAGEMAKER_ACCESS_KEYS": f"tests={SAGEMAKER_KEY_ID}:{SAGEMAKER_SECRET}",
            "TRAINGUARD_RULE_MODULES": "tests.services.rules_for_tests",  # the custom rules the tests use
            "TRAINGUARD_DATA_DIR": str(data_dir),
            "TRAINGUARD_LAUNCHER": "local",
            "TRAINGUARD_PORT": str(self.port),
            "TRAINGUARD_RECONCILE_INTERVAL": "0.2",
            "TRAINGUARD_STOP_GRACE_SECONDS": "10",
            "NO_PROXY": "127.0.0.1,localhost",
            **extra_env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainguard.services.api"], cwd=REPO, env=self.environment, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

        def healthy() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the API exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                return self.request("GET", "/health", auth=False)[0] == 200
            except OSError:
                return False

        wait_for(healthy, timeout, "the API to answer /health")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log_tail(self, size: int = 6000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def request(
        self, method: str, path: str, body: Any = None, *, auth: bool = True, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {token or self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
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

    def signed_request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key_id: str = SAGEMAKER_KEY_ID,
        secret: str = SAGEMAKER_SECRET,
    ) -> tuple[int, Any]:
        """A native API request as the access key ``key_id`` (SigV4, service 'trainguard'), not the
        operator: its jobs are the key's, the ones its SageMaker client (:meth:`sagemaker`) sees."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        data = json.dumps(body).encode() if body is not None else b""
        headers = {"Host": self.url.removeprefix("http://"), "Content-Type": "application/json"}
        signed = AWSRequest(method=method, url=self.url + path, data=data, headers=headers)
        SigV4Auth(Credentials(key_id, secret), "trainguard", "us-east-1").add_auth(signed)
        request = urllib.request.Request(
            self.url + path, data=data or None, method=method, headers=dict(signed.headers)
        )
        try:
            with self._opener.open(request, timeout=30) as response:
                raw, status = response.read(), response.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def job(self, name: str) -> dict[str, Any]:
        status, body = self.request("GET", f"/v1/jobs/{name}")
        assert status == 200, body
        return body

    def sagemaker(self, region: str = "us-east-1"):  # noqa: ANN201 - a botocore client
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=SAGEMAKER_KEY_ID, aws_secret_access_key=SAGEMAKER_SECRET, region_name=region
        )
        return session.client("sagemaker", endpoint_url=self.url)


@pytest.fixture
def api_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ApiServer]]:
    """Start APIs (``api_factory(**extra_env)``); all are killed, and their jobs' processes stopped, at the end."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    servers: list[ApiServer] = []

    def start(**extra_env: str) -> ApiServer:
        server = ApiServer(tmp_path / f"api-{len(servers)}", extra_env)
        server.data_dir.mkdir(parents=True)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill(signal.SIGTERM)
        _stop_local_jobs(server.data_dir / "local")


def _stop_local_jobs(root: Path) -> None:
    """Kill whatever a test left running (a failed test must not leave training processes behind)."""
    if not root.is_dir():
        return
    for pid_file in root.glob("*/*/pid"):
        if (pid_file.parent / "exit_code").exists():
            continue
        try:
            os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


@pytest.fixture
def api(api_factory: Callable[..., ApiServer], s3_endpoint: str) -> ApiServer:  # noqa: F811
    """The API with an S3 endpoint (moto) holding the bucket ``bkt``: SageMaker requests name
    ``s3://bkt/`` outputs, which jobs really write to (model.tar.gz, the uploaded run)."""
    from tests.s3_server import s3_client

    client = s3_client(s3_endpoint)
    try:
        client.create_bucket(Bucket="bkt")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return api_factory(S3_ENDPOINT_URL=s3_endpoint)


def training_command(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "tests" / "services" / "train_script.py"), *args]


CUSTOM_RULE = "tests.services.rules_for_tests:LossAboveThreshold"
HOOK_EVERY_STEP = {"HookParameters": {"save_interval": "1"}}
