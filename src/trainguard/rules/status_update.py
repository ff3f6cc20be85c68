"""A rule configuration's status transition or finding, as the runner reports it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trainguard.rules.base import MissingTensor, RuleStatus, StepResult

__all__ = ["StatusUpdate"]


@dataclass(frozen=True)
class StatusUpdate:
    """One status transition or finding of one rule configuration."""

    configuration_name: str
    rule: str
    status: RuleStatus
    status_details: str = ""
    step: int | None = None
    result: StepResult | None = None
    last_evaluated_step: int | None = None
    timestamp: float = field(default_factory=time.time)
    statistics: dict[str, Any] | None = None  # the rule's statistics (RuleProgress.statistics)
    # With a final Error/RuleNotEvaluated status: the rule does not apply to this run by its design
    # (see StepResult.not_applicable), as opposed to "could not evaluate".
    not_applicable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "configuration_name": self.configuration_name,
            "rule": self.rule,
            "status": RuleStatus(self.status).value,
            "status_details": self.status_details,
            "step": self.step,
            "result": self.result.to_dict() if self.result is not None else None,
            "last_evaluated_step": self.last_evaluated_step,
            "timestamp": self.timestamp,
            **({"statistics": self.statistics} if self.statistics is not None else {}),
            "not_applicable": self.not_applicable,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StatusUpdate:
        """The inverse of :meth:`to_dict` (for a parent reading a runner's JSON lines)."""
        raw = data.get("result")
        result = None
        if raw:
            result = StepResult(
                rule=raw["rule"],
                step=int(raw["step"]),
                fired=bool(raw["fired"]),
                message=raw.get("message", ""),
                fix_hint=raw.get("fix_hint", ""),
                details=raw.get("details") or {},
                missing=tuple(MissingTensor(m["what"], m.get("collection")) for m in raw.get("missing") or ()),
                certain=bool(raw.get("certain", False)),
                worker=raw.get("worker"),
                not_evaluated=raw.get("not_evaluated"),
                advice=bool(raw.get("advice", False)),
                not_applicable=bool(raw.get("not_applicable", False)),
            )
        return cls(
            configuration_name=data["configuration_name"],
            rule=data["rule"],
            status=RuleStatus(data["status"]),
            status_details=data.get("status_details") or "",
            step=data.get("step"),
            result=result,
            last_evaluated_step=data.get("last_evaluated_step"),
            timestamp=float(data.get("timestamp") or time.time()),
            statistics=data["statistics"] if isinstance(data.get("statistics"), dict) else None,
            not_applicable=bool(data.get("not_applicable", False)),
        )
