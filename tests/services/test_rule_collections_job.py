"""A native API job whose hook config names no collections is captured with what its built-in
rules read (as ``trainguard run --rules`` captures): SaturatedActivation reads ``tanh_input``,
which zero-code capture's defaults do not save, and judges the job instead of saying it could not."""

from __future__ import annotations

import pytest

from tests.services.conftest import HOOK_EVERY_STEP, training_command, wait_for

pytestmark = pytest.mark.slow


def test_a_built_in_rules_collections_are_saved_without_being_named(api_factory) -> None:
    api = api_factory()
    spec = {
        "name": "saturated",
        "command": training_command("--steps", "12", "--saturate"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": "SaturatedActivation", "name": "Saturation"}],
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    job = wait_for(
        lambda: (j := api.job("saturated"))["status"] in ("Completed", "Failed", "Stopped")
        and j["rules"][0]["status"] not in ("InProgress", "Pending") and j,
        180, "the job and its rule to end",
    )  # fmt: skip
    rule = job["rules"][0]
    assert job["status"] == "Completed", job
    assert rule["status"] == "IssuesFound", rule
    assert "tanh" in str(rule["findings"][0]).lower(), rule
