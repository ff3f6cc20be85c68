"""Built-in action handlers: stoptraining, webhook, email (SMTP or SNS), sms (SNS), sns."""

from __future__ import annotations

import json
import smtplib
import time
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

from trainguard.services.actions import pinned_http
from trainguard.services.actions.context import ActionContext
from trainguard.services.actions.stop_policy import finding_stops
from trainguard.services.actions.validation import check_email_address, check_header, check_webhook_url

__all__ = ["check_webhook_url", "email", "sms", "sns_publish", "stop_training", "webhook"]

SNS_TOPIC = "SMDebugRules"  # SageMaker's topic name, so existing subscriptions keep working


def _rule_of(event: Mapping[str, Any]) -> str:
    extra = event.get("trainguard") or {}
    return str(extra.get("rule") or extra.get("alarm") or "rule")


def _message(event: Mapping[str, Any]) -> tuple[str, str]:
    """Subject and body in SageMaker's wording ("SMDebugRule:<rule> fired. ...")."""
    rule = _rule_of(event)
    extra = event.get("trainguard") or {}
    detail = event.get("detail") or {}
    finding = extra.get("finding") or {}
    parts = [f"SMDebugRule:{rule} fired.", f"Training job {detail.get('TrainingJobName')}"]
    if extra.get("reason"):
        parts.append(str(extra["reason"]))
    if finding.get("message"):
        parts.append(f"Finding at step {finding.get('step')}: {finding['message']}")
    if finding.get("fix_hint"):
        parts.append(f"Fix: {finding['fix_hint']}")
    return f"SMDebugRule:{rule} fired", "\n".join(parts)


def stop_training(event: Mapping[str, Any], action: Mapping[str, Any], context: ActionContext) -> str:
    """Stop the job: by exact name when the prefix is the job's name, else only a single match."""
    finding = (event.get("trainguard") or {}).get("finding") or {}
    stops, why_not = finding_stops(finding)  # uncertain findings and advice are reported, they never stop
    if not stops:
        return f"not stopped: {_rule_of(event)}'s {why_not.removeprefix('the ')}"
    prefix = str(action.get("training_job_prefix") or context.job_name)
    grace = action.get("grace_seconds")
    cause = f"rule {_rule_of(event)} found issues (stoptraining action)"
    if prefix.lower() == context.job_name.lower():
        target = context.job_name
    else:
        matches = [name for name in context.in_progress_jobs() if name.lower().startswith(prefix.lower())]
        if len(matches) != 1:
            return (
                f"not stopped: {len(matches)} InProgress jobs start with {prefix!r} "
                "(SageMaker stops only a single match)"
            )
        target = matches[0]
    context.stop_job(target, float(grace) if grace not in (None, "") else None, cause)
    if finding.get("step") is not None:
        return f"stop requested for {target} ({_rule_of(event)}'s finding at step {finding['step']})"
    return f"stop requested for {target}"


def webhook(event: Mapping[str, Any], action: Mapping[str, Any], context: ActionContext) -> str:
    """POST the event as JSON to an address the outbound policy allows; retried on no answer and 5xx/429.

    A refused target, a redirect (never followed) or another 4xx fails at once, without retries.
    """
    url = check_webhook_url(str(action["url"]))
    attempts = max(1, int(action.get("retries", 3)) + 1)
    headers = {"Content-Type": "application/json", "User-Agent": "trainguard-webhook"}
    for name, value in (action.get("headers") or {}).items():
        check_header(str(name), str(value))  # also for actions recorded before creation refused them
        headers[str(name)] = str(value)
    body = json.dumps(event).encode()
    last_error = ""
    for attempt in range(attempts):
        try:
            result = pinned_http.post(url, body, headers, policy=context.outbound, timeout=context.webhook_timeout)
        except pinned_http.DeliveryError as error:
            last_error = str(error)
        else:
            if 200 <= result.status < 300:
                return f"POST {url}: HTTP {result.status} after {attempt + 1} attempt(s)"
            last_error = f"HTTP {result.status}"
            if 300 <= result.status < 400:
                raise RuntimeError(
                    f"POST {url}: HTTP {result.status} redirect to {result.location[:200]!r} not followed "
                    "(webhooks are never redirected; give the final URL)"
                )
            if result.status < 500 and result.status != 429:
                raise RuntimeError(f"POST {url}: {last_error} (not retried)")
        if attempt + 1 < attempts:
            time.sleep(min(8.0, 0.25 * 2**attempt))
    raise RuntimeError(f"POST {url} failed after {attempts} attempt(s): {last_error}")


def _sns_client(context: ActionContext) -> Any:  # a botocore client (boto3 is untyped)
    import boto3

    return boto3.client("sns", region_name=context.region, endpoint_url=context.sns_endpoint_url or None)


def _sns_notify(event: Mapping[str, Any], protocol: str, attribute: str, endpoint: str, context: ActionContext) -> str:
    """SageMaker's path: topic SMDebugRules, a filtered subscription per endpoint, one publish."""
    client = _sns_client(context)
    topic = client.create_topic(Name=SNS_TOPIC)["TopicArn"]
    existing = client.list_subscriptions_by_topic(TopicArn=topic).get("Subscriptions", [])
    if not any(s.get("Endpoint") == endpoint and s.get("Protocol") == protocol for s in existing):
        client.subscribe(
            TopicArn=topic,
            Protocol=protocol,
            Endpoint=endpoint,
            Attributes={"FilterPolicy": json.dumps({attribute: [endpoint]})},
        )
    subject, body = _message(event)
    response = client.publish(
        TopicArn=topic,
        Subject=subject,
        Message=body,
        MessageAttributes={attribute: {"DataType": "String", "StringValue": endpoint}},
    )
    return f"published to {topic} for {endpoint}: {response['MessageId']}"


def email(event: Mapping[str, Any], action: Mapping[str, Any], context: ActionContext) -> str:
    """E-mail over SMTP when TRAINGUARD_SMTP_HOST is set, else through SNS as SageMaker does."""
    recipient = check_email_address(str(action["endpoint"]))
    if not context.smtp.get("host"):
        return _sns_notify(event, "email", "email", recipient, context)
    subject, body = _message(event)
    message = EmailMessage()
    message["Subject"] = subject
    message["From"] = context.smtp.get("from", "trainguard@localhost")
    message["To"] = recipient
    message.set_content(body + "\n\nEvent:\n" + json.dumps(event, indent=2))
    port = int(context.smtp.get("port", "25"))
    with smtplib.SMTP(context.smtp["host"], port, timeout=10) as server:
        if context.smtp.get("starttls") == "1":
            server.starttls()
        if context.smtp.get("user"):
            server.login(context.smtp["user"], context.smtp.get("password", ""))
        server.send_message(message)
    return f"mailed {recipient} via {context.smtp['host']}:{port}"


def sms(event: Mapping[str, Any], action: Mapping[str, Any], context: ActionContext) -> str:
    return _sns_notify(event, "sms", "phone_num", str(action["endpoint"]), context)


def sns_publish(event: Mapping[str, Any], action: Mapping[str, Any], context: ActionContext) -> str:
    """Publish the whole event JSON to a topic (``topic_arn``), e.g. for a Lambda subscriber."""
    client = _sns_client(context)
    subject, _ = _message(event)
    response = client.publish(TopicArn=str(action["topic_arn"]), Subject=subject[:99], Message=json.dumps(event))
    return f"published to {action['topic_arn']}: {response['MessageId']}"
