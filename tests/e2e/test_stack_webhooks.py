"""Webhooks inside the compose stack reach none of its services: real API container, real proxy.

The attack this closes: a job's webhook POSTed to ``http://docker-proxy:2375/containers/<id>/kill``
and killed another job's container. Here a job's rule fires webhooks at the Docker proxy (that
very kill), the API, S3, loopback and the cloud metadata address; each run fails refused, and the
other job's training container is still running afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.stack import Stack, job_spec, running_stack
from tests.polling import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from running_stack()


def test_webhooks_reach_neither_the_proxy_nor_the_stacks_services(stack: Stack) -> None:
    from trainguard.services.launchers.docker import container_name

    victim = "webhook-victim"
    stack.submit(job_spec(victim, lr=0.01, steps=3000, step_sleep=0.1, stop=False))
    wait_for(lambda: stack.job(victim)["secondary_status"] == "Training", 180, "the victim to train")
    targets = [
        f"http://docker-proxy:2375/containers/{container_name(victim, 'training')}/kill",
        "http://api:8080/v1/jobs",
        "http://s3:5000/trainguard",
        "http://127.0.0.1:8080/v1/jobs",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:127.0.0.1]:8080/v1/jobs",
    ]
    attacker = job_spec("webhook-attacker", lr=5.0, steps=200, stop=False)
    attacker["rules"][0]["actions"] = [{"name": "webhook", "url": url, "retries": 0} for url in targets]
    stack.submit(attacker)

    def all_ran() -> list[dict] | None:
        actions = stack.job("webhook-attacker")["actions"]
        done = [a for a in actions if a["status"] not in ("Pending", "Running")]
        return actions if len(done) == len(targets) else None

    try:
        actions = wait_for(all_ran, 420, "the attacker's webhooks to run")
    except AssertionError:
        job = stack.job("webhook-attacker")
        raise AssertionError(f"{job['status']} {job['rules']} {job['actions']}\n{stack.logs('webhook-attacker')[-2000:]}") from None
    for action in actions:
        assert action["status"] == "Failed", action
        assert "OutboundRefused" in action["detail"] and "may not reach" in action["detail"], action
    details = " | ".join(a["detail"] for a in actions)
    assert "docker-proxy:2375 is the stack's own service" in details or "a private address" in details
    victim_job = stack.job(victim)
    assert victim_job["status"] == "InProgress", victim_job
    training = {c["role"]: c for c in victim_job["components"]}["training"]
    assert training["state"] in ("running", "Running"), training
    print("refused:", *(a["detail"][:160] for a in actions), sep="\n  ")
    stack.request("POST", f"/v1/jobs/{victim}/stop?grace_seconds=1")
