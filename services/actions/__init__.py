"""Lambda-style actions run by the API when an alarm goes into ALARM (or a rule finds issues).

A handler is ``handler(event, action, context) -> str``: ``event`` is an EventBridge
"SageMaker Training Job State Change" document (``detail`` shaped like DescribeTrainingJob, plus a
``trainguard`` key naming the alarm, the rule and the finding), ``action`` the action's own
config (``{"name": "webhook", "url": ...}``), ``context`` an :class:`ActionContext`. The return
value is a one-line description for the action log; an exception marks the run failed.

Built-in: ``stoptraining``, ``webhook``, ``email`` (SMTP, else SNS), ``sms`` (SNS), ``sns``.
Custom handlers: entry points in the group ``trainguard.actions`` (name = action name).

Webhooks connect only where :mod:`.outbound_policy` allows (checked on the resolved address, the
connection pinned to it: :mod:`.pinned_http`); action fields are checked at creation by
:mod:`.validation`; stop actions run on their own path (:mod:`.dispatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from trainguard.services.actions.context import ActionContext
from trainguard.services.actions.event import build_event, parse_action_json

__all__ = ["ENTRY_POINT_GROUP", "ActionContext", "action_names", "build_event", "get_handler", "parse_action_json"]

ENTRY_POINT_GROUP = "trainguard.actions"
Handler = Callable[[Mapping[str, Any], Mapping[str, Any], ActionContext], str]


def _builtin_handlers() -> dict[str, Handler]:
    from trainguard.services.actions import handlers

    return {
        "stoptraining": handlers.stop_training,
        "webhook": handlers.webhook,
        "email": handlers.email,
        "sms": handlers.sms,
        "sns": handlers.sns_publish,
    }


def action_names() -> set[str]:
    return set(_builtin_handlers()) | {entry.name.lower() for entry in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def get_handler(name: str) -> Handler:
    name = name.lower()
    builtins = _builtin_handlers()
    if name in builtins:
        return builtins[name]
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name.lower() == name:
            return entry.load()
    raise KeyError(f"unknown action {name!r}; valid: {', '.join(sorted(action_names()))}")
