"""A real S3 server for tests: moto's HTTP server in a subprocess, not in-process mocking.

Talking to a separate process over HTTP exercises what in-process mocks skip: botocore's
endpoint handling, retries, timeouts, ranged GETs and multipart uploads on the wire.

Use from a conftest::

    from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401  (pytest finds them by name)

``s3_endpoint`` (session scope) is the server's URL; ``s3_bucket`` (function scope) creates a
fresh bucket, puts dummy credentials in the environment for the test, and returns its name.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["DUMMY_CREDENTIALS", "create_bucket", "s3_bucket", "s3_client", "s3_endpoint", "set_dummy_credentials"]

REGION = "us-east-1"
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
# Whatever the developer's shell or ~/.aws holds must not leak into tests (or tests into AWS).
_ISOLATING_UNSET = (
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
)
_START_TIMEOUT_S = 30.0


def set_dummy_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path | None = None) -> None:
    """Point boto3 at dummy credentials only: no profile, no config file, no instance metadata."""
    for name in _ISOLATING_UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    missing = str((tmp_path or Path(os.devnull)) / "no-aws-config")
    monkeypatch.setenv("AWS_CONFIG_FILE", missing)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", missing)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _MotoServer:
    """One moto server per test process, shared by every fixture definition that asks for it.

    Both a root conftest and a folder's conftest may import ``s3_endpoint``; pytest then holds
    two session fixtures, and the reference count keeps them from starting two servers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._process: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def acquire(self, log_path: Path) -> str:
        with self._lock:
            if self._process is None:
                self._start(log_path)
            self._users += 1
            return self.endpoint

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._process is not None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
                self._process = None

    def _start(self, log_path: Path) -> None:
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        environment = {**os.environ, **DUMMY_CREDENTIALS, "NO_PROXY": "127.0.0.1,localhost"}
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto server exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                # Bypass any proxy: the server is on loopback.
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(f"{endpoint}/moto-api/data.json", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise RuntimeError(
                        f"moto server did not answer on {endpoint} within {_START_TIMEOUT_S:.0f} s:\n{_tail(log_path)}"
                    ) from None
                time.sleep(0.05)
        self._process = process
        self.endpoint = endpoint


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError:
        return "(no log)"


_SERVER = _MotoServer()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a moto S3 server running in a subprocess for the whole session."""
    # find_spec, not import: the server runs in its own process, so this one need not load moto.
    for module in ("boto3", "moto", "flask"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"S3 tests need boto3 and moto[server] ({module} is missing): pip install -e '.[test]'")
    endpoint = _SERVER.acquire(tmp_path_factory.mktemp("moto") / "server.log")
    try:
        yield endpoint
    finally:
        _SERVER.release()


@functools.cache
def s3_client(endpoint: str):  # noqa: ANN201 - a botocore client, typed dynamically
    """A plain boto3 client for the test server, to set up or inspect what a test needs.

    One per endpoint, shared: clients are thread-safe, and building one costs a tenth of a second.
    """
    import boto3

    return boto3.session.Session(**_session_arguments()).client("s3", endpoint_url=endpoint)


def _session_arguments() -> dict[str, str]:
    return {
        "aws_access_key_id": DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": REGION,
    }


def create_bucket(endpoint: str, name: str | None = None) -> str:
    """Create a bucket on the server (a fresh random name unless given) and return its name."""
    name = name or f"tg-{uuid.uuid4().hex[:16]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A new, empty bucket on the test server; dummy credentials are set for the test's duration."""
    set_dummy_credentials(monkeypatch, tmp_path)
    return create_bucket(s3_endpoint)
