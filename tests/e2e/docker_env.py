"""The real Docker engine, Compose and the stack's images for the end-to-end tests.

These tests never mock the engine. Where Docker cannot be had (not root, no engine) they skip with
the reason; in CI (CI=true, root, scripts/test.sh ran infra/setup_docker.sh and build_images.sh)
a missing engine or image is a failure, not a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("TRAINGUARD_BASE_IMAGE", "trainguard-base:bookworm")
TRAINING_IMAGE = "trainguard-training:local"
SERVICE_IMAGE = "trainguard-service:local"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Skip outside CI; fail in CI, where the engine must be there."""
    if in_ci():
        pytest.fail(f"CI must run the Docker end-to-end tests, but: {reason}")
    pytest.skip(reason)


def docker_client():  # noqa: ANN201 - docker.DockerClient
    """A client of a running engine; as root, installs and starts one first if none answers."""
    try:
        import docker
    except ImportError:
        unavailable("the Docker SDK is missing: pip install 'docker>=7,<8'")
    for attempt in ("as is", "after infra/setup_docker.sh"):
        try:
            client = docker.from_env(timeout=30)
            client.ping()
            return client
        except Exception as error:  # noqa: BLE001 - any failure to reach the engine
            reason = f"no Docker engine answers ({error})"
        if attempt == "as is" and os.geteuid() == 0:
            result = subprocess.run(["bash", "infra/setup_docker.sh"], cwd=REPO, capture_output=True, text=True,
                                    timeout=600)  # fmt: skip
            if result.returncode != 0:
                unavailable(f"{reason}, and infra/setup_docker.sh failed:\n{result.stderr[-2000:]}")
        else:
            break
    unavailable(f"{reason}; Docker needs root to install and start: sudo bash infra/setup_docker.sh")


def require_image(client, image: str, build_script: str) -> None:  # noqa: ANN001
    """The image must exist; as root, build it with the repository's script the first time."""
    import docker.errors

    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    if os.geteuid() != 0:
        unavailable(f"image {image} is missing and building it needs root: bash {build_script}")
    result = subprocess.run(["bash", build_script], cwd=REPO, capture_output=True, text=True, timeout=1500)
    if result.returncode != 0:
        pytest.fail(f"bash {build_script} failed:\n{result.stderr[-4000:]}")


def compose_available() -> bool:
    result = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    return result.returncode == 0 and "v2" in result.stdout
