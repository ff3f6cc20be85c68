"""The service ships in the wheel: a fresh venv with the built wheel runs ``trainguard serve``.

No clone on the path: the wheel is built from this checkout, installed into a new venv (its
dependencies come from this environment's site-packages, so nothing is downloaded), and the API
is started from an empty directory. The SageMaker endpoint is then called with the credentials
``serve`` generated, by boto3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.s3_server import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(root), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = root.glob("trainguard-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--no-index", str(wheel)], check=True)
    return venv


def _clean_environment(tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "AWS_", "S3_"))}
    environment.pop("PYTHONPATH", None)
    environment.update({"HOME": str(tmp_path), "NO_PROXY": "127.0.0.1,localhost"})
    return environment


def test_wheel_carries_the_services_as_trainguard_services(wheel_venv: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util, json, trainguard.services.api.app as app, trainguard.services.sagemaker_container;"
        "print(json.dumps({'app': app.__file__, 'bare': importlib.util.find_spec('services') is not None}))"
    )
    result = subprocess.run(
        [str(wheel_venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=_clean_environment(tmp_path),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = json.loads(result.stdout)
    assert found["app"].startswith(str(wheel_venv)), found  # from the wheel, not the checkout
    assert found["bare"] is False  # never a top-level "services" package


def test_trainguard_serve_from_the_wheel_answers_boto3(wheel_venv: Path, tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "state"
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [str(wheel_venv / "bin" / "trainguard"), "serve", "--port", str(port), "--data-dir", str(data_dir),
         "--no-embedded-s3"],
        cwd=tmp_path, env=_clean_environment(tmp_path), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.3)
        credentials_file = data_dir / "credentials.json"
        assert credentials_file.stat().st_mode & 0o777 == 0o600
        credentials = json.loads(credentials_file.read_text())
        banner = (tmp_path / "serve.log").read_text()
        assert credentials["sagemaker_access_key_id"] in banner and f"AWS_ENDPOINT_URL_SAGEMAKER=http://127.0.0.1:{port}" in banner

        import boto3

        client = boto3.session.Session(
            aws_access_key_id=credentials["sagemaker_access_key_id"],
            aws_secret_access_key=credentials["sagemaker_secret_access_key"], region_name="us-east-1",
        ).client("sagemaker", endpoint_url=f"http://127.0.0.1:{port}")  # fmt: skip
        assert client.list_training_jobs()["TrainingJobSummaries"] == []
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {credentials['api_token']}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
    finally:
        server.terminate()
        server.wait(timeout=20)
        log.close()
