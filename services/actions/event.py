"""The event document handlers receive, and SageMaker's ``action_json`` parsing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["build_event", "parse_action_json"]


def _millis(value: Any) -> Any:
    return str(int(round(float(value) * 1000))) if isinstance(value, (int, float)) else value


def build_event(
    description: Mapping[str, Any], *, account: str, region: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An EventBridge "SageMaker Training Job State Change" event for a DescribeTrainingJob dict.

    Timestamps in ``detail`` are epoch-millisecond strings, as in AWS's documented example, so a
    Lambda written for SageMaker's events runs unchanged.
    """
    detail: dict[str, Any] = {}
    for key, value in description.items():
        if key.endswith("Time"):
            detail[key] = _millis(value)
        elif key == "DebugRuleEvaluationStatuses" or key == "ProfilerRuleEvaluationStatuses":
            detail[key] = [{k: _millis(v) if k.endswith("Time") else v for k, v in s.items()} for s in value]
        elif key == "SecondaryStatusTransitions":
            detail[key] = [{k: _millis(v) if k.endswith("Time") else v for k, v in t.items()} for t in value]
        else:
            detail[key] = value
    event: dict[str, Any] = {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "SageMaker Training Job State Change",
        "source": "aws.sagemaker",
        "account": account,
        "region": region,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "resources": [description.get("TrainingJobArn", "")],
        "detail": detail,
    }
    if extra:
        event["trainguard"] = dict(extra)
    return event


def parse_action_json(text: str) -> list[dict[str, Any]]:
    """SageMaker's ``RuleParameters["action_json"]``: a dict or a list of dicts.

    The SDK escapes every quote with a literal backslash; parse as-is first, then un-escaped.
    Like the rules container, names are lower-cased; entries without a name are dropped.
    """
    if not text or not text.strip():
        return []
    try:
        parsed = json.loads(text)
    except ValueError:
        try:
            parsed = json.loads(text.replace('\\"', '"'))
        except ValueError as error:
            raise ValueError(f"action_json is not JSON (even with the SDK's escaping undone): {error}") from None
    if isinstance(parsed, str):  # doubly encoded
        return parse_action_json(parsed)
    items = parsed if isinstance(parsed, list) else [parsed]
    actions = []
    for item in items:
        if isinstance(item, dict) and item.get("name"):
            action = dict(item)
            action["name"] = str(action["name"]).lower()
            actions.append(action)
    return actions
