"""Rule actions (SageMaker's ``action_json``): what should happen when a rule fires.

The runner does not carry out actions itself (stopping a job or sending mail is the
controller's job: ``trainguard run`` locally, the service's controller remotely); it only needs
to know whether a rule's actions say *stop*, because such a rule stops evaluating after it fires.

``action_json`` arrives as SageMaker's SDK builds it: a JSON string in which every quote may be
preceded by a literal backslash (``[{\\"name\\": \\"stoptraining\\"}]``). Names are compared
lower-cased, as smdebug did; entries that are not objects with a ``name`` are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["STOP_TRAINING", "parse_action_json", "spec_actions", "stops_training"]

STOP_TRAINING = "stoptraining"


def parse_action_json(value: Any) -> list[dict[str, Any]]:
    """Actions from an ``action_json`` value (string, dict or list); [] for None/empty.

    Raises:
        ConfigError: the string is neither JSON nor SageMaker's escaped JSON.
    """
    if value is None:
        return []
    if isinstance(value, Mapping):
        items: Any = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        text = str(value).strip()
        if not text or text.lower() == "none":
            return []
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            try:
                items = json.loads(text.replace('\\"', '"'))
            except json.JSONDecodeError as error:
                raise ConfigError(f"action_json {text[:80]!r} is not JSON: {error}") from None
        if isinstance(items, dict):
            items = [items]
    if not isinstance(items, list):
        raise ConfigError(f"action_json must be a JSON object or a list of objects, got {type(items).__name__}")
    return [
        {str(k).lower(): (v.lower() if str(k).lower() == "name" and isinstance(v, str) else v) for k, v in item.items()}
        for item in items
        if isinstance(item, Mapping) and item.get("name")
    ]


def spec_actions(spec: Any) -> list[dict[str, Any]]:
    """A RuleSpec's actions: its ``actions`` plus any ``action_json`` rule parameter."""
    actions = [dict(action) for action in getattr(spec, "actions", ()) or ()]
    actions = parse_action_json(actions) if actions else []
    return actions + parse_action_json(dict(getattr(spec, "parameters", {}) or {}).get("action_json"))


def stops_training(actions: Iterable[Mapping[str, Any]]) -> bool:
    return any(str(action.get("name", "")).lower() == STOP_TRAINING for action in actions)
