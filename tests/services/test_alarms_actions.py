"""Alarms evaluated by trainguard and the actions they run, delivered to real servers."""

from __future__ import annotations

import ipaddress
import json

import pytest

from trainguard.services.actions import ActionContext, build_event, get_handler, parse_action_json
from trainguard.services.actions.outbound_policy import OutboundPolicy
from trainguard.services.alarms import AlarmSpec, AlarmState, evaluate_alarm
from tests.s3_server import set_dummy_credentials
from tests.services.conftest import CUSTOM_RULE, HOOK_EVERY_STEP, REPO, training_command, wait_for
from tests.services.notify_servers import RecordingHttpServer, RecordingSmtpServer


@pytest.mark.parametrize(
    ("values", "state"),
    [
        ([], AlarmState.INSUFFICIENT_DATA),
        ([1.0], AlarmState.INSUFFICIENT_DATA),  # 1 of 2 so far; the alarm may still be reached
        ([0.0], AlarmState.OK),  # one clean datapoint, but 2 of 3 can still breach... see below
        ([1.0, 0.0, 1.0], AlarmState.ALARM),
        ([1.0, 0.0, 0.0], AlarmState.OK),
        ([1.0, 1.0, 0.0, 0.0, 0.0], AlarmState.OK),  # only the latest M count
        ([0.0, 0.0, 1.0, 1.0], AlarmState.ALARM),
    ],
)
def test_n_of_m_evaluation(values, state) -> None:
    spec = AlarmSpec("a", threshold=1.0, evaluation_periods=3, datapoints_to_alarm=2)
    expected = state
    if values == [0.0]:
        expected = AlarmState.INSUFFICIENT_DATA  # 0 breaching + 2 missing can still make 2 of 3
    assert evaluate_alarm(spec, values)[0] is expected


def test_comparisons_and_thresholds() -> None:
    assert evaluate_alarm(AlarmSpec("a", comparison="GreaterThanThreshold", threshold=1.0), [1.0])[0] is AlarmState.OK
    assert (
        evaluate_alarm(AlarmSpec("a", comparison="GreaterThanOrEqualToThreshold", threshold=1.0), [1.0])[0]
        is AlarmState.ALARM
    )
    assert evaluate_alarm(AlarmSpec("a", comparison="LessThanThreshold", threshold=0.5), [0.0])[0] is AlarmState.ALARM
    assert (
        evaluate_alarm(AlarmSpec("a", comparison="LessThanOrEqualToThreshold", threshold=0.5), [0.7])[0]
        is AlarmState.OK
    )
    with pytest.raises(ValueError, match="comparison"):
        AlarmSpec("a", comparison="Bigger")


def test_sdk_escaped_action_json_parses() -> None:
    escaped = (
        '[{\\"name\\": \\"StopTraining\\", \\"training_job_prefix\\": \\"job\\"}, '
        '{\\"endpoint\\": \\"a@b.com\\", \\"name\\": \\"email\\"}]'
    )
    assert parse_action_json(escaped) == [
        {"name": "stoptraining", "training_job_prefix": "job"},
        {"name": "email", "endpoint": "a@b.com"},
    ]
    assert parse_action_json('{"name": "sms", "endpoint": "+15551234567"}') == [
        {"name": "sms", "endpoint": "+15551234567"}
    ]
    with pytest.raises(ValueError, match="action_json"):
        parse_action_json("[{name: broken")


def _context(**kwargs) -> ActionContext:
    return ActionContext(job_name="job-1", stop_job=lambda *a: None, in_progress_jobs=lambda: ["job-1"], **kwargs)


# The receivers here listen on loopback, which webhooks may reach only when the operator allows it.
LOOPBACK_ALLOWED = OutboundPolicy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))


def _event() -> dict:
    description = {"TrainingJobName": "job-1", "TrainingJobArn": "arn:aws:sagemaker:us-east-1:0:training-job/job-1",
                   "TrainingJobStatus": "InProgress", "LastModifiedTime": 1700000000.5,
                   "DebugRuleEvaluationStatuses": [{"RuleConfigurationName": "R", "RuleEvaluationStatus": "IssuesFound"}]}  # fmt: skip
    return build_event(description, account="000000000000", region="us-east-1", extra={"rule": "R"})


def test_webhook_retries_until_delivered() -> None:
    with RecordingHttpServer(fail_first=2) as server:
        detail = get_handler("webhook")(
            _event(), {"name": "webhook", "url": server.url, "retries": 3}, _context(outbound=LOOPBACK_ALLOWED)
        )
    assert "after 3 attempt(s)" in detail
    [delivery] = server.received
    assert delivery["body"]["detail-type"] == "SageMaker Training Job State Change"
    assert delivery["body"]["detail"]["LastModifiedTime"] == "1700000000500"  # epoch-ms string, as AWS's events


def test_webhook_gives_up_after_its_retries() -> None:
    with RecordingHttpServer(fail_first=10) as server, pytest.raises(RuntimeError, match="after 2 attempt"):
        get_handler("webhook")(
            _event(), {"name": "webhook", "url": server.url, "retries": 1}, _context(outbound=LOOPBACK_ALLOWED)
        )


def test_stoptraining_stops_only_a_single_prefix_match() -> None:
    stopped: list[str] = []
    context = ActionContext("job-1", stop_job=lambda name, grace, cause: stopped.append(name),
                            in_progress_jobs=lambda: ["exp-a", "exp-b", "other"])  # fmt: skip
    assert "2 InProgress jobs" in get_handler("stoptraining")(
        _event(), {"name": "stoptraining", "training_job_prefix": "exp"}, context
    )
    assert stopped == []
    get_handler("stoptraining")(_event(), {"name": "stoptraining", "training_job_prefix": "oth"}, context)
    get_handler("stoptraining")(_event(), {"name": "stoptraining"}, context)
    assert stopped == ["other", "job-1"]


def test_sns_publish_and_email_through_sns_reach_a_subscribed_queue(s3_endpoint, monkeypatch, tmp_path) -> None:
    import boto3

    set_dummy_credentials(monkeypatch, tmp_path)

    sns = boto3.client("sns", endpoint_url=s3_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=s3_endpoint, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName="trainguard-test")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    topic = sns.create_topic(Name="SMDebugRules")["TopicArn"]  # the topic the email/sms actions use
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    context = _context(sns_endpoint_url=s3_endpoint)

    get_handler("sns")(_event(), {"name": "sns", "topic_arn": topic}, context)
    get_handler("email")(_event(), {"name": "email", "endpoint": "oncall@example.com"}, context)

    messages = []
    for _ in range(10):
        messages += sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        if len(messages) >= 2:
            break
    bodies = [json.loads(m["Body"]) for m in messages]
    published_events = [json.loads(b["Message"]) for b in bodies if b["Message"].startswith("{")]
    assert published_events[0]["detail"]["TrainingJobName"] == "job-1"
    emails = [b for b in bodies if b["Message"].startswith("SMDebugRule:R fired.")]
    assert emails and emails[0]["Subject"] == "SMDebugRule:R fired"
    assert emails[0]["MessageAttributes"]["email"]["Value"] == "oncall@example.com"


@pytest.mark.slow
def test_alarm_n_of_m_runs_webhook_email_and_stop_on_a_live_job(api_factory) -> None:
    with RecordingSmtpServer() as smtp, RecordingHttpServer() as hook, RecordingHttpServer() as events:
        api = api_factory(TRAINGUARD_SMTP_HOST="127.0.0.1", TRAINGUARD_SMTP_PORT=str(smtp.port),
                          TRAINGUARD_SMTP_FROM="trainguard@test.local", TRAINGUARD_EVENT_WEBHOOK_URL=events.url,
                          TRAINGUARD_WEBHOOK_ALLOW="127.0.0.1")  # fmt: skip
        spec = {
            "name": "alarmed-job",
            "command": training_command("--steps", "400", "--blowup-at", "4", "--step-seconds", "0.05"),
            "hook_config": HOOK_EVERY_STEP,
            "rules": [{"rule": CUSTOM_RULE, "name": "LossBlowup", "parameters": {"threshold": 1000},
                       "actions": [{"name": "email", "endpoint": "oncall@example.com"}]}],
            "alarms": [{"name": "loss-2-of-3", "rule": "LossBlowup", "evaluation_periods": 3, "datapoints_to_alarm": 2,
                        "actions": [{"name": "webhook", "url": hook.url}, {"name": "stoptraining", "grace_seconds": 5}]}],
        }  # fmt: skip
        status, body = api.request("POST", "/v1/jobs", spec)
        assert status == 201, body
        job = wait_for(
            lambda: (j := api.job("alarmed-job"))["status"] == "Stopped" and j, 90, "the alarm to stop the job"
        )
        wait_for(lambda: smtp.messages and hook.received, 20, "the e-mail and the webhook")
        wait_for(
            lambda: all(a["status"] != "Running" for a in api.job("alarmed-job")["actions"]), 20, "actions to finish"
        )
        job = api.job("alarmed-job")

    alarm = {a["name"]: a for a in job["alarms"]}["loss-2-of-3"]
    assert alarm["state"] == "ALARM" and "2 of the latest" in alarm["reason"]
    assert job["rules"][0]["status"] == "IssuesFound"
    assert job["stop_cause"] == "rule LossBlowup found issues (stoptraining action)"
    [mail] = smtp.messages
    assert mail["to"] == ["oncall@example.com"] and "Subject: SMDebugRule:LossBlowup fired" in mail["data"]
    assert "lower the learning rate" in mail["data"]  # the finding's fix hint
    event = hook.received[0]["body"]
    assert event["detail"]["TrainingJobName"] == "alarmed-job"
    assert event["trainguard"]["alarm"] == "loss-2-of-3"
    assert event["detail"]["DebugRuleEvaluationStatuses"][0]["RuleEvaluationStatus"] == "IssuesFound"
    statuses = {e["body"]["detail"]["TrainingJobStatus"] for e in events.received}
    assert {"InProgress", "Stopped"} <= statuses  # every state change was emitted
    ran = {(a["alarm"], a["action"]): a["status"] for a in job["actions"]}
    assert ran == {("LossBlowup-IssuesFound", "email"): "Succeeded", ("loss-2-of-3", "webhook"): "Succeeded",
                   ("loss-2-of-3", "stoptraining"): "Succeeded"}  # fmt: skip


def _install_action_plugin(root) -> None:
    """A real installed distribution (dist-info with entry_points.txt), as pip would leave it."""
    (root / "tg_test_actions.py").write_text(
        "import json, pathlib\n"
        "def record(event, action, context):\n"
        "    pathlib.Path(action['path']).write_text(json.dumps(event))\n"
        "    return 'recorded ' + context.job_name\n"
    )
    info = root / "tg_test_actions-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tg-test-actions\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[trainguard.actions]\nrecord-to-file = tg_test_actions:record\n")


def test_custom_action_handlers_come_from_entry_points(tmp_path, monkeypatch) -> None:
    from trainguard.services.actions import action_names
    from trainguard.services.api.schemas import RuleConfig

    _install_action_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "record-to-file" in action_names()
    target = tmp_path / "event.json"
    handler = get_handler("record-to-file")
    assert handler(_event(), {"name": "record-to-file", "path": str(target)}, _context()) == "recorded job-1"
    assert json.loads(target.read_text())["detail"]["TrainingJobName"] == "job-1"
    RuleConfig.model_validate({"rule": CUSTOM_RULE, "actions": [{"name": "record-to-file", "path": str(target)}]})
    with pytest.raises(ValueError, match="record-to-file"):  # the error lists the plug-in among the valid names
        RuleConfig.model_validate({"rule": CUSTOM_RULE, "actions": [{"name": "nope"}]})


@pytest.mark.slow
def test_custom_action_runs_in_the_api_when_the_rule_fires(api_factory, tmp_path) -> None:
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    _install_action_plugin(plugin)
    import os

    api = api_factory(PYTHONPATH=os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", ""), str(REPO)]))
    target = tmp_path / "fired.json"
    spec = {
        "name": "plugin-job",
        "command": training_command("--steps", "8", "--blowup-at", "3"),
        "hook_config": HOOK_EVERY_STEP,
        "rules": [
            {"rule": CUSTOM_RULE, "name": "LossBlowup", "actions": [{"name": "record-to-file", "path": str(target)}]}
        ],
    }
    status, body = api.request("POST", "/v1/jobs", spec)
    assert status == 201, body
    wait_for(target.exists, 60, "the plug-in action to run")
    event = json.loads(target.read_text())
    assert event["trainguard"]["alarm"] == "LossBlowup-IssuesFound"
    assert event["trainguard"]["finding"]["fired"] is True
    job = wait_for(
        lambda: (j := api.job("plugin-job"))["actions"] and j["actions"][0]["status"] == "Succeeded" and j,
        20,
        "the run",
    )
    assert job["actions"][0]["detail"] == "recorded plugin-job"
