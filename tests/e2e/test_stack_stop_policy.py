"""The stop policy on the compose stack (Docker launcher): a certain finding after uncertain ones
stops the job; a job with only uncertain findings trains to its end.

The rule is tests/services/rules_for_stop_policy.py, shipped with the job as its ``source_uri`` (the
rule container fetches it from the stack's S3), so the sequence of findings is the test's own:
uncertain from step 2, certain from ``certain_at``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.stack import DEMO, REPO, Stack, running_stack, wait_for

pytestmark = pytest.mark.slow

RULE_FILE = REPO / "tests" / "services" / "rules_for_stop_policy.py"
RULE_KEY = "rules/rules_for_stop_policy.py"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    for running in running_stack():
        client = running.s3()
        try:
            client.create_bucket(Bucket="trainguard")
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        client.put_object(Bucket="trainguard", Key=RULE_KEY, Body=RULE_FILE.read_bytes())
        yield running


def _spec(name: str, steps: int, certain_at: int) -> dict:
    return {
        "name": name,
        "command": [*DEMO, "--lr", "0.01", "--steps", str(steps), "--step-sleep", "0.05"],
        "hook_config": {"HookParameters": {"save_interval": "1"}},
        "resources": {"cpus": 1.0, "memory_mb": 2048},
        "rules": [{"rule": "UncertainThenCertain", "name": "Sequence", "source_uri": f"s3://trainguard/{RULE_KEY}",
                   "parameters": {"uncertain_from": 2, "certain_at": certain_at},
                   "actions": [{"name": "stoptraining"}]}],
    }  # fmt: skip


def _stop_actions(stack: Stack, name: str) -> list[dict]:
    def finished() -> list[dict] | None:
        actions = [a for a in stack.job(name)["actions"] if a["action"] == "stoptraining"]
        return actions if actions and all(a["status"] not in ("Pending", "Running") for a in actions) else None

    return wait_for(finished, 60, f"the stop actions of {name} to finish")


def test_a_certain_finding_after_uncertain_ones_stops_the_job(stack):  # noqa: ANN001
    name = f"e2e-stoppolicy-{uuid.uuid4().hex[:6]}"
    stack.submit(_spec(name, 600, 30))
    job = stack.wait_settled(name, timeout_s=300)
    assert job["status"] == "Stopped", job
    findings = job["rules"][0]["findings"]
    assert findings[0]["certain"] is False
    certain = [finding for finding in findings if finding["certain"]]
    assert certain and certain[0]["step"] >= 30
    first, *later = _stop_actions(stack, name)
    assert "is not certain" in first["detail"]
    assert [a["detail"] for a in later] == [f"stop requested for {name} (Sequence's finding at step {certain[0]['step']})"]
    assert "trainguard-demo: done" not in stack.logs(name)


def test_a_job_with_only_uncertain_findings_completes(stack):  # noqa: ANN001
    name = f"e2e-uncertain-{uuid.uuid4().hex[:6]}"
    stack.submit(_spec(name, 40, -1))
    job = stack.wait_settled(name, timeout_s=300)
    assert job["status"] == "Completed", job
    assert len(job["rules"][0]["findings"]) > 5 and not any(f["certain"] for f in job["rules"][0]["findings"])
    assert all("is not certain" in a["detail"] for a in _stop_actions(stack, name))
