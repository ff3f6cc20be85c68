"""DockerLauncher against the real engine: start, status, logs, limits, stop with grace, find again."""

from __future__ import annotations

import time
import uuid

import pytest

from trainguard.services.launchers.base import ComponentSpec, ComponentState, JobLaunch, LauncherError
from trainguard.services.launchers.docker import JOB_LABEL, ROLE_LABEL, DockerLauncher, container_name
from tests.e2e.docker_env import BASE_IMAGE, docker_client, require_image

# A process that answers SIGTERM by exiting 0 after saying so, and one that ignores SIGTERM.
_POLITE = "trap 'echo got TERM; exit 0' TERM; echo hello from $ROLE_NAME; while true; do sleep 0.1; done"
_STUBBORN = "trap '' TERM; echo stubborn; while true; do sleep 0.1; done"


@pytest.fixture(scope="module")
def client():  # noqa: ANN201
    engine = docker_client()
    require_image(engine, BASE_IMAGE, "infra/build_base_image.sh")
    yield engine
    engine.close()


@pytest.fixture
def job_name(client):  # noqa: ANN001, ANN201
    name = f"tgtest-{uuid.uuid4().hex[:8]}"
    yield name
    DockerLauncher(client).remove(name)


def _wait(predicate, timeout_s: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout_s} s")


def test_start_status_logs_stop_and_find_again(client, job_name):  # noqa: ANN001
    launcher = DockerLauncher(client)
    job = JobLaunch(
        job_name,
        (
            ComponentSpec(
                "training", BASE_IMAGE, ("bash", "-c", _POLITE), environment={"ROLE_NAME": "training"},
                cpus=0.5, memory_mb=128, volumes={f"tg-{job_name}-tensors": "/opt/ml/output/tensors"},
            ),
            ComponentSpec("rule:Stubborn Rule", BASE_IMAGE, ("bash", "-c", _STUBBORN), cpus=0.25, memory_mb=64),
        ),
    )
    launcher.start(job)
    launcher.start(job)  # idempotent: no second set of containers

    containers = client.containers.list(all=True, filters={"label": f"{JOB_LABEL}={job_name}"})
    assert sorted(c.labels[ROLE_LABEL] for c in containers) == ["rule:Stubborn Rule", "training"]
    training = client.containers.get(container_name(job_name, "training"))
    host_config = training.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 500_000_000
    assert host_config["Memory"] == 128 * 1024 * 1024
    assert host_config["CpuShares"] == 256  # a quarter of the services' 1024: the API keeps priority, jobs run
    assert any(m["Type"] == "volume" and m["Name"] == f"tg-{job_name}-tensors" for m in training.attrs["Mounts"])

    _wait(lambda: "hello from training" in launcher.logs(job_name, "training"))
    assert launcher.status(job_name)["training"].state is ComponentState.RUNNING

    # A new launcher object (as after an API restart) finds the job from the labels alone.
    restarted = DockerLauncher(client)
    assert job_name in restarted.jobs()
    assert set(restarted.status(job_name)) == {"training", "rule:Stubborn Rule"}

    started = time.monotonic()
    restarted.stop(job_name, grace_seconds=2)
    elapsed = time.monotonic() - started
    statuses = restarted.status(job_name)
    assert statuses["training"].state is ComponentState.EXITED
    assert statuses["training"].exit_code == 0  # it handled SIGTERM within the grace
    assert "got TERM" in restarted.logs(job_name, "training")
    stubborn = statuses["rule:Stubborn Rule"]
    assert stubborn.exit_code == 137 and stubborn.reason == "killed by SIGKILL"
    assert elapsed >= 2.0  # the stubborn one got its full grace before the kill
    assert restarted.logs(job_name, "training", tail=1).strip() == "got TERM"

    restarted.remove(job_name)
    assert restarted.status(job_name) == {}
    assert job_name not in restarted.jobs()
    assert client.volumes.list(filters={"label": f"{JOB_LABEL}={job_name}"}) == []


def test_exit_code_and_oom_reason(client, job_name):  # noqa: ANN001
    launcher = DockerLauncher(client)
    launcher.start(
        JobLaunch(
            job_name,
            (
                ComponentSpec("training", BASE_IMAGE, ("bash", "-c", "echo failing >&2; exit 3")),
                # Allocate and touch 256 MB under a 48 MB limit: the kernel's OOM killer ends it.
                ComponentSpec(
                    "uploader", BASE_IMAGE,
                    ("python3", "-c", "b = bytearray(256 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])"),
                    memory_mb=48,
                ),
            ),
        )
    )
    statuses = _wait(
        lambda: (s := launcher.status(job_name)) and all(v.state is ComponentState.EXITED for v in s.values()) and s
    )
    assert statuses["training"].exit_code == 3
    assert "failing" in launcher.logs(job_name, "training")
    assert statuses["uploader"].reason == "OOMKilled"


def test_missing_image_and_network_are_clear_errors(client, job_name):  # noqa: ANN001
    launcher = DockerLauncher(client)
    with pytest.raises(LauncherError, match="build the images"):
        launcher.start(JobLaunch(job_name, (ComponentSpec("training", "trainguard-no-such:image", ("true",)),)))
    assert launcher.status(job_name) == {}
    with pytest.raises(LauncherError, match="no-such-network"):
        DockerLauncher(client, network="no-such-network").start(
            JobLaunch(job_name, (ComponentSpec("training", BASE_IMAGE, ("true",)),))
        )


def test_job_cpu_shares_come_from_the_environment_and_are_bounded(client, job_name, monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("TRAINGUARD_JOB_CPU_SHARES", "512")
    launcher = DockerLauncher(client)
    launcher.start(JobLaunch(job_name, (ComponentSpec("training", BASE_IMAGE, ("true",)),)))
    assert client.containers.get(container_name(job_name, "training")).attrs["HostConfig"]["CpuShares"] == 512
    for bad in ("1", "lots", "300000"):
        monkeypatch.setenv("TRAINGUARD_JOB_CPU_SHARES", bad)
        with pytest.raises(LauncherError, match="TRAINGUARD_JOB_CPU_SHARES|cpu_shares"):
            DockerLauncher(client)
