"""What an action handler may use: stop a job, list jobs, the notification settings, the outbound policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trainguard.services.actions.outbound_policy import OutboundPolicy

__all__ = ["ActionContext"]


@dataclass(frozen=True)
class ActionContext:
    job_name: str
    stop_job: Callable[[str, float | None, str], None]  # (job name, grace seconds or None = default, cause)
    in_progress_jobs: Callable[[], list[str]]  # names of InProgress jobs, newest first
    smtp: Mapping[str, str] = field(default_factory=dict)
    sns_endpoint_url: str = ""
    region: str = "us-east-1"
    webhook_timeout: float = 5.0  # seconds per attempt: connect, send and the answer's headers together
    outbound: OutboundPolicy = field(default_factory=OutboundPolicy)  # where webhooks may connect
