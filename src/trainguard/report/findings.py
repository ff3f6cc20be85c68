"""Rule results of a run, read from the files rule runners write: ``<run>/rule-output/<Name>.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import StorageError
from trainguard.storage.base import Store

__all__ = ["RULE_OUTPUT_PREFIX", "RuleOutcome", "read_rule_outputs"]

RULE_OUTPUT_PREFIX = "rule-output/"


@dataclass
class RuleOutcome:
    """One rule configuration's file: its status and every finding it recorded."""

    configuration_name: str
    rule: str
    status: str
    status_details: str = ""
    last_evaluated_step: int | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    missing: list[dict[str, Any]] = field(default_factory=list)
    updated_at: float | None = None
    dropped_findings: int = 0  # findings the runner left out of the file to bound its size

    @property
    def fired(self) -> list[dict[str, Any]]:
        """Findings where the rule's condition was met, in step order."""
        return sorted(
            (f for f in self.findings if f.get("fired")), key=lambda f: (f.get("step") is None, f.get("step"))
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any], key: str) -> RuleOutcome:
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        name = str(data.get("configuration_name") or key.rsplit("/", 1)[-1].removesuffix(".json"))
        findings = data.get("findings") or []
        missing = data.get("missing") or []
        if not isinstance(findings, list) or not all(isinstance(f, dict) for f in findings):
            raise ValueError("'findings' must be a list of objects")
        if not isinstance(missing, list):
            raise ValueError("'missing' must be a list")
        step = data.get("last_evaluated_step")
        updated = data.get("updated_at")
        dropped = data.get("dropped_findings")
        return cls(
            configuration_name=name,
            rule=str(data.get("rule") or name),
            status=str(data.get("status") or "Unknown"),
            status_details=str(data.get("status_details") or ""),
            last_evaluated_step=int(step) if isinstance(step, (int, float)) else None,
            findings=findings,
            missing=[m if isinstance(m, dict) else {"what": str(m)} for m in missing],
            updated_at=float(updated) if isinstance(updated, (int, float)) else None,
            dropped_findings=int(dropped) if isinstance(dropped, (int, float)) else 0,
        )


def read_rule_outputs(store: Store) -> tuple[list[RuleOutcome], list[str]]:
    """Every ``rule-output/*.json`` of the run, and a problem line for each file that is unreadable.

    A broken file is reported, not raised: one bad rule file must not hide the rest of a report.
    """
    outcomes, problems = [], []
    try:
        keys = [
            key
            for key in store.list(RULE_OUTPUT_PREFIX)
            if key.endswith(".json") and "/" not in key[len(RULE_OUTPUT_PREFIX) :]
        ]
    except StorageError as error:
        return [], [f"could not list {store.url}/{RULE_OUTPUT_PREFIX}: {error}"]
    for key in sorted(keys):
        try:
            outcomes.append(RuleOutcome.from_dict(json.loads(store.read(key)), key))
        except (ValueError, TypeError, StorageError) as error:
            problems.append(f"{store.url}/{key} is not a rule result file: {error}")
    return sorted(outcomes, key=lambda o: o.configuration_name), problems
