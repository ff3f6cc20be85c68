"""The service stops like ``trainguard run``: every finding is put to the stop policy.

A rule whose first findings are uncertain (reported, never stopping) and a later one certain: the
certain one stops the job (it used to be lost: the rule's alarm was already in ALARM, and actions
ran only when it entered ALARM). A job with only uncertain findings trains to its end. The jobs
run under the real API, rule runner and local launcher; the rule is a test rule with a controlled
sequence of findings (tests/services/rules_for_stop_policy.py).
"""

from __future__ import annotations

import pytest

from trainguard.services.actions import ActionContext, get_handler
from trainguard.services.actions.stop_policy import finding_at, finding_stops, restop_actions

from tests.services.conftest import HOOK_EVERY_STEP, training_command, wait_for

SEQUENCE_RULE = "tests.services.rules_for_stop_policy:UncertainThenCertain"
STOP = {"name": "stoptraining", "grace_seconds": 5}
MAIL = {"name": "email", "endpoint": "oncall@example.com"}
RULE_MODULES = "tests.services.rules_for_tests,tests.services.rules_for_stop_policy"


def test_only_certain_findings_that_are_not_advice_stop() -> None:
    assert finding_stops({"step": 3, "certain": True}) == (True, "")
    assert finding_stops({"step": 3})[0]  # a rule that predates `certain` (or a metric of the user's own) stops
    stops, why = finding_stops({"step": 3, "certain": False})
    assert not stops and "step 3 is not certain" in why
    stops, why = finding_stops({"step": 4, "certain": False, "advice": True})
    assert not stops and "advice never stops" in why


def test_a_new_finding_restops_until_a_stop_was_recorded_for_a_certain_one() -> None:
    uncertain, certain = {"step": 1, "certain": False}, {"step": 9, "certain": True}
    # only the stop actions are repeated (a notification goes out when the alarm enters ALARM)
    assert restop_actions([MAIL, STOP], certain, [uncertain]) == [STOP]
    assert restop_actions([MAIL, STOP], certain, [uncertain, certain]) == []  # stopped already
    assert restop_actions([MAIL, STOP], uncertain, [uncertain]) == []  # it would only decline again
    assert restop_actions([MAIL, STOP], {"step": 9, "certain": False, "advice": True}, []) == []
    assert restop_actions([MAIL], certain, []) == []


def test_the_finding_of_a_datapoint_is_the_one_at_its_step() -> None:
    findings = [{"step": 1}, {"step": 5}, {"step": 9}]
    assert finding_at(findings, 5) == {"step": 5}
    assert finding_at(findings, 7) == {"step": 9}  # not found: the latest
    assert finding_at([], 5) is None


def test_stoptraining_declines_advice_and_uncertain_findings_and_names_the_stopping_one() -> None:
    stopped: list[str] = []
    context = ActionContext("job-1", stop_job=lambda name, grace, cause: stopped.append(name),
                            in_progress_jobs=lambda: ["job-1"])  # fmt: skip

    def event(finding: dict) -> dict:
        return {"trainguard": {"rule": "R", "finding": finding}, "detail": {"TrainingJobName": "job-1"}}

    handler = get_handler("stoptraining")
    assert "advice never stops" in handler(event({"step": 2, "certain": False, "advice": True}), STOP, context)
    assert "step 3 is not certain" in handler(event({"step": 3, "certain": False}), STOP, context)
    assert stopped == []
    assert handler(event({"step": 7, "certain": True}), STOP, context) == "stop requested for job-1 (R's finding at step 7)"
    assert stopped == ["job-1"]


def _job(name: str, steps: int, certain_at: int) -> dict:
    return {
        "name": name,
        "command": training_command("--steps", str(steps), "--step-seconds", "0.05"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [{"rule": SEQUENCE_RULE, "name": "Sequence",
                   "parameters": {"uncertain_from": 2, "certain_at": certain_at}, "actions": [STOP]}],
    }  # fmt: skip


def _stop_actions(job: dict) -> list[dict]:
    return [action for action in job["actions"] if action["action"] == "stoptraining"]


@pytest.mark.slow
def test_a_certain_finding_after_uncertain_ones_stops_the_job(api_factory) -> None:
    api = api_factory(TRAINGUARD_RULE_MODULES=RULE_MODULES)
    status, body = api.request("POST", "/v1/jobs", _job("uncertain-then-certain", 400, 30))
    assert status == 201, body
    wait_for(lambda: api.job("uncertain-then-certain")["status"] == "Stopped", 120, "the certain finding to stop the job")
    wait_for(lambda: all(a["status"] not in ("Pending", "Running") for a in api.job("uncertain-then-certain")["actions"]),
             20, "the actions to finish")  # fmt: skip
    job = api.job("uncertain-then-certain")
    findings = job["rules"][0]["findings"]
    assert findings[0]["certain"] is False and findings[0]["step"] >= 2
    certain = [finding for finding in findings if finding["certain"]]
    assert certain and certain[0]["step"] >= 30
    first, *later = _stop_actions(job)
    assert "is not certain" in first["detail"]  # the alarm entered ALARM on an uncertain finding: declined
    [stopping] = later  # one stop, for the first certain finding; the uncertain ones between recorded nothing
    assert stopping["status"] == "Succeeded"
    assert stopping["detail"] == f"stop requested for uncertain-then-certain (Sequence's finding at step {certain[0]['step']})"
    assert job["stop_cause"] == "rule Sequence found issues (stoptraining action)"
    log = api.request("GET", "/v1/jobs/uncertain-then-certain/logs?component=training")[1]
    assert "step 399" not in log


@pytest.mark.slow
def test_a_job_with_only_uncertain_findings_runs_to_completion(api_factory) -> None:
    api = api_factory(TRAINGUARD_RULE_MODULES=RULE_MODULES)
    status, body = api.request("POST", "/v1/jobs", _job("only-uncertain", 40, -1))
    assert status == 201, body
    wait_for(lambda: api.job("only-uncertain")["status"] in ("Completed", "Stopped", "Failed"), 120, "the job to end")
    wait_for(lambda: all(a["status"] not in ("Pending", "Running") for a in api.job("only-uncertain")["actions"]),
             20, "the actions to finish")  # fmt: skip
    job = api.job("only-uncertain")
    assert job["status"] == "Completed"
    assert len(job["rules"][0]["findings"]) > 5 and not any(f["certain"] for f in job["rules"][0]["findings"])
    assert [a["detail"] for a in _stop_actions(job)] == [_stop_actions(job)[0]["detail"]]
    assert "is not certain" in _stop_actions(job)[0]["detail"]
    log = api.request("GET", "/v1/jobs/only-uncertain/logs?component=training")[1]
    assert "step 39" in log


def test_advice_is_no_issues_found_datapoint() -> None:
    from trainguard.rules.base import StepResult
    from trainguard.services.rule_runner.__main__ import _Rule

    rule = _Rule({"TRAINING_JOB_NAME": "job", "RULE_CONFIGURATION_NAME": "Data"})
    rule.evaluated(StepResult(rule="Data", step=3, fired=True, advice=True, certain=False))
    rule.evaluated(StepResult(rule="Data", step=4, fired=True, certain=True))
    assert [(point["step"], point["value"]) for point in rule.datapoints] == [(3, 0.0), (4, 1.0)]
