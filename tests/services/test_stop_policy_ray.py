"""The stop policy with the Ray launcher (tests/services/test_ray_launcher.py's real local Ray
cluster): a certain finding after uncertain ones stops the job through Ray."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.job_submission", reason="the ray launcher tests need Ray: pip install -e '.[ray]'")

from tests.services.conftest import wait_for  # noqa: E402
from tests.services.test_ray_launcher import ray_cluster  # noqa: E402,F401 - the module's cluster fixture
from tests.services.test_stop_policy import RULE_MODULES, _job, _stop_actions  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_certain_finding_after_uncertain_ones_stops_a_ray_job(ray_cluster, api_factory) -> None:  # noqa: F811
    api = api_factory(TRAINGUARD_LAUNCHER="ray", RAY_ADDRESS=ray_cluster.address, TRAINGUARD_STOP_GRACE_SECONDS="5",
                      TRAINGUARD_RULE_MODULES=RULE_MODULES)  # fmt: skip
    status, body = api.request("POST", "/v1/jobs", _job("ray-uncertain-then-certain", 400, 30))
    assert status == 201, body
    wait_for(lambda: api.job("ray-uncertain-then-certain")["status"] == "Stopped", 240, "the certain finding to stop it")
    wait_for(lambda: all(a["status"] not in ("Pending", "Running") for a in api.job("ray-uncertain-then-certain")["actions"]),
             30, "the actions to finish")  # fmt: skip
    job = api.job("ray-uncertain-then-certain")
    certain = [finding for finding in job["rules"][0]["findings"] if finding["certain"]]
    first, *later = _stop_actions(job)
    assert "is not certain" in first["detail"]
    assert [a["detail"] for a in later] == [
        f"stop requested for ray-uncertain-then-certain (Sequence's finding at step {certain[0]['step']})"
    ]
