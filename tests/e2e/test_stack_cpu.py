"""The CPU weight the Docker launcher gives job containers by default (TRAINGUARD_JOB_CPU_SHARES),
judged on the real engine: a job container beside a busy container of Docker's default weight
(a stack service working flat out, another workload on the host), both on one core, must still
get a real part of it, and less than that service. CPU time is read from the engine, and the
ratio of two always-runnable containers on one core follows their weights whatever else the
machine runs. bench/cpu_shares.py measures the API's /health latency and a job's step rate.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.e2e.docker_env import TRAINING_IMAGE, docker_client, require_image

pytestmark = pytest.mark.slow

_SPIN = ["-c", "while True: pass"]


def _cpu_ns(container) -> int:  # noqa: ANN001 - docker.models.containers.Container
    return int(container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"])


def test_a_job_at_the_default_weight_gets_cpu_beside_a_busy_service_and_less_than_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainguard.services.launchers.docker import DockerLauncher

    client = docker_client()
    require_image(client, TRAINING_IMAGE, "infra/build_images.sh")
    monkeypatch.delenv("TRAINGUARD_JOB_CPU_SHARES", raising=False)
    job_shares = DockerLauncher(client).cpu_shares
    tag = uuid.uuid4().hex[:6]
    started = []
    try:
        for role, shares in (("service", 1024), ("job", job_shares)):
            started.append(client.containers.run(
                TRAINING_IMAGE, _SPIN, entrypoint="python", name=f"tg-cpu-test-{tag}-{role}", detach=True,
                cpu_shares=shares, cpuset_cpus="0", labels={"trainguard.test": "cpu-shares"},
            ))  # fmt: skip
        service, job = started
        time.sleep(2)  # both spinning
        service_before, job_before = _cpu_ns(service), _cpu_ns(job)
        time.sleep(6)
        service_used, job_used = _cpu_ns(service) - service_before, _cpu_ns(job) - job_before
    finally:
        for container in started:
            container.remove(force=True)
        client.close()
    ratio = job_used / service_used
    # The weights' ratio is job_shares / 1024: 0.25 at the default; the minimum weight (2) gave 0.002.
    assert 0.1 < ratio < 0.6, f"job/service CPU {ratio:.3f} at cpu_shares {job_shares}"
