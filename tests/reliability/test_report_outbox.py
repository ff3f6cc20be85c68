"""Rule-runner reports survive an API restart: the runner's durable outbox replays them in order
until the API acknowledges, and the API applies each (outbox, sequence) once."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from tests.polling import wait_for
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, training_command
from trainguard.services.rule_runner.reporting import ReportOutbox


def test_every_report_and_datapoint_arrives_across_an_api_restart(api_factory) -> None:
    api = api_factory()
    spec = {"name": "api-restart", "hook_config": HOOK_EVERY_STEP,
            "command": training_command("--steps", "120", "--step-seconds", "0.05"),
            "rules": [{"rule": CUSTOM_RULE, "name": "Loss", "parameters": {"threshold": 1e30}}]}  # fmt: skip
    assert api.request("POST", "/v1/jobs", spec)[0] == 201
    wait_for(lambda: (api.job("api-restart")["rules"][0].get("last_evaluated_step") or -1) >= 10, 60, "reports")
    api.kill(signal.SIGKILL)  # mid-run: the runner keeps evaluating and reporting into the void
    time.sleep(3)
    api.start()
    job = wait_for(
        # the rule can end a reconcile poll before the job does (training's process is exiting)
        lambda: (j := api.job("api-restart"))["rules"][0]["status"] not in ("InProgress",)
        and j["status"] != "InProgress" and j,
        90, "the rule and the job to end",
    )
    assert job["status"] == "Completed" and job["rules"][0]["status"] == "NoIssuesFound", job
    with sqlite3.connect(api.data_dir / "trainguard.db") as db:
        steps = [row[0] for row in db.execute(
            "SELECT step FROM metric_data WHERE job_name='api-restart' AND metric_name='RuleIssuesFound'"
        )]  # fmt: skip
    # One datapoint per evaluated step: none lost while the API was down, none applied twice.
    assert sorted(steps) == list(range(120)), (len(steps), sorted(set(range(120)) - set(steps)))
    assert len(steps) == len(set(steps))
    assert job["rules"][0]["last_evaluated_step"] == 119


def test_outbox_replays_unacknowledged_reports_after_a_restart(tmp_path: Path) -> None:
    """A runner killed with reports not yet acknowledged: the next one on the same work dir sends them."""
    delivered: list[dict] = []
    first = ReportOutbox(tmp_path / "r.jsonl", lambda document: "retry")  # the API is down
    first.put({"status": "InProgress"})
    first.put({"datapoints": [{"step": 1}]})
    assert not first.close(timeout=0.3)  # nothing acknowledged; the process would die here
    second = ReportOutbox(tmp_path / "r.jsonl", lambda document: delivered.append(document) or "acknowledged")
    second.put({"status": "NoIssuesFound"})
    assert second.close(timeout=10)
    assert [d["sequence"] for d in delivered] == [1, 2, 3]
    assert {d["outbox"] for d in delivered} == {first.id} == {second.id}
    assert delivered[2]["status"] == "NoIssuesFound"
    third = ReportOutbox(tmp_path / "r.jsonl", lambda document: delivered.append(document) or "acknowledged")
    assert third.close(timeout=1) and len(delivered) == 3  # acknowledged reports are not sent again


def test_datapoints_wait_for_company_and_a_status_sends_them_at_once(tmp_path: Path) -> None:
    """One POST (one API commit) per batch window for the per-step datapoints, not one per step; a
    status or finding is never held back, nor are the datapoints before it."""
    delivered: list[dict] = []
    outbox = ReportOutbox(tmp_path / "r.jsonl", lambda d: delivered.append(d) or "acknowledged", batch_s=1.5)
    outbox.put({"configuration_name": "Loss", "datapoints": [{"step": 0, "value": 0.0}]})
    wait_for(lambda: delivered, 1.0, "the first report, at once (the rule started evaluating)")
    began = time.monotonic()
    for step in range(1, 6):
        outbox.put({"configuration_name": "Loss", "datapoints": [{"step": step, "value": 0.0}]})
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(delivered) == 1  # the next ones are still within the window
    wait_for(lambda: len(delivered) == 2, 5, "the batch")
    assert time.monotonic() - began >= 1.4
    assert [len(d["datapoints"]) for d in delivered] == [1, 5] and delivered[1]["last_evaluated_step"] == 5
    outbox.put({"configuration_name": "Loss", "datapoints": [{"step": 6, "value": 0.0}]})
    outbox.put({"configuration_name": "Loss", "status": "IssuesFound", "datapoints": [{"step": 7, "value": 1.0}]})
    wait_for(lambda: len(delivered) == 4, 1.0, "the status and the datapoint before it, at once")
    assert [d["sequence"] for d in delivered] == [1, 6, 7, 8] and delivered[3]["status"] == "IssuesFound"
    outbox.put({"configuration_name": "Loss", "datapoints": [{"step": 8, "value": 0.0}]})
    assert outbox.close(timeout=1.0) and len(delivered) == 5  # close() does not wait out the window
