"""The Docker launcher's restart on the real engine: a component killed with ``docker kill`` (which
the engine's own restart policy ignores) is started again by :meth:`DockerLauncher.restart`, with
its writable layer and volume intact, so an uploader resumes from its state file."""

from __future__ import annotations

import uuid

import pytest
from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch, LauncherError
from trainguard.services.launchers.docker import DockerLauncher, container_name

from tests.e2e.docker_env import SERVICE_IMAGE, docker_client, require_image
from tests.polling import wait_for

# Counts its own starts in a file of its writable layer: a restart must find the earlier count.
_COUNTING = (
    "import pathlib, time; p = pathlib.Path('/tmp/starts'); "
    "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); print('start', n, flush=True); "
    "time.sleep(300)"
)


def test_killed_container_is_restarted_with_its_state() -> None:
    client = docker_client()
    require_image(client, SERVICE_IMAGE, "infra/build_images.sh")
    launcher = DockerLauncher(client, network=None)  # the engine default network
    job = f"restart-{uuid.uuid4().hex[:8]}"
    component = ComponentSpec("uploader", SERVICE_IMAGE, ("python", "-c", _COUNTING))
    launcher.start(JobLaunch(job, (component,)))
    try:
        wait_for(lambda: "start 1" in launcher.logs(job, "uploader"), 60, "the first start")
        client.containers.get(container_name(job, "uploader")).kill()  # docker kill: SIGKILL
        status = wait_for(
            lambda: (s := launcher.status(job)["uploader"]).state is ComponentState.EXITED and s, 30, "the kill"
        )
        assert status.exit_code == 137 and "SIGKILL" in status.reason
        launcher.restart(job, "uploader")
        wait_for(lambda: "start 2" in launcher.logs(job, "uploader"), 60, "the restart")  # same writable layer
        assert launcher.status(job)["uploader"].state is ComponentState.RUNNING
        launcher.restart(job, "uploader")  # running: a no-op
        with pytest.raises(LauncherError, match="no 'rule:R' container"):
            launcher.restart(job, "rule:R")
    finally:
        launcher.remove(job)


def test_a_file_is_read_out_of_a_component_that_exited() -> None:
    """How the reconciler reads the uploader's status in its volume: a regular file of the role's
    container, also once it exited; a missing file, a directory or one too large is None."""
    client = docker_client()
    require_image(client, SERVICE_IMAGE, "infra/build_images.sh")
    launcher = DockerLauncher(client, network=None)
    job = f"read-{uuid.uuid4().hex[:8]}"
    writes = """import pathlib; pathlib.Path('/data/status.json').write_text('{"state": "stopped"}')"""
    component = ComponentSpec("uploader", SERVICE_IMAGE, ("python", "-c", writes), volumes={f"tg-{job}-data": "/data"})
    launcher.start(JobLaunch(job, (component,)))
    try:
        wait_for(lambda: launcher.status(job)["uploader"].state is ComponentState.EXITED, 60, "the component to exit")
        assert launcher.status(job)["uploader"].exit_code == 0, launcher.logs(job, "uploader")
        assert launcher.read_file(job, "uploader", "/data/status.json", 1024) == b'{"state": "stopped"}'
        assert launcher.read_file(job, "uploader", "/data/status.json", 5) is None
        assert launcher.read_file(job, "uploader", "/data/missing.json", 1024) is None
        assert launcher.read_file(job, "uploader", "/data", 1024) is None
        assert launcher.read_file(job, "rule:R", "/data/status.json", 1024) is None
    finally:
        launcher.remove(job)
