"""What a rule runner has done so far, kept on disk so a restarted runner resumes exactly.

Two kinds of files, both written atomically (temp file + ``os.replace``) so a reader or a
restarted runner never sees half a file:

* the progress file (``--progress FILE``): per rule configuration, the last evaluated global
  step, the status, the findings and whether ``finish()`` already ran. A runner that restarts
  with the same file evaluates only later steps and never records a finding twice.
* ``<output_dir>/rule-output/<RuleConfigurationName>.json``: the per-rule result file the report
  and ``trainguard summary`` read (format in the project's common contract).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["RuleProgress", "load_progress", "write_json_atomic", "write_progress", "write_rule_output"]

PROGRESS_VERSION = 1
RULE_OUTPUT_DIR = "rule-output"
# A rule that fires on every step of a long run would otherwise make every progress write bigger;
# the first findings are the ones that matter, and the count of the rest is kept.
MAX_KEPT_FINDINGS = 1000
MAX_KEPT_MISSING = 20


@dataclass
class RuleProgress:
    """The runner's state for one rule configuration."""

    configuration_name: str
    rule: str
    status: str = "InProgress"
    status_details: str = ""
    last_evaluated_step: int | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    dropped_findings: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False  # finish() ran, or the rule stopped for good (stop action, error)
    error: bool = False
    # Whether any result was a real evaluation (a finding or "looked, found nothing"); a rule
    # that only ever said "not evaluated" or "missing" ends with Error: RuleNotEvaluated.
    evaluated: bool = False
    not_evaluated: str = ""  # the first reason a result gave for not evaluating
    # The rule's latest statistics (``details["statistics"]`` of a no-issue result, e.g.
    # OverallSystemUsage's percentiles per resource), for its rule-output file and the summary.
    statistics: dict[str, Any] | None = None
    # The rule does not apply to this run by its design (StepResult.not_applicable, or
    # Rule.inapplicable at the end); its reason is then ``not_evaluated``.
    not_applicable: bool = False
    # Per-worker rules: worker -> the last step its instance evaluated (a worker whose steps land
    # after the cursor passed them is evaluated on them later). None: a file from before this
    # existed, whose workers are taken as evaluated up to last_evaluated_step.
    worker_steps: dict[str, int] | None = None
    _finding_keys: set[tuple[Any, ...]] | None = field(default=None, repr=False, compare=False)

    @property
    def fired_steps(self) -> set[int]:
        return {int(finding["step"]) for finding in self.findings if finding.get("fired")}

    def add_finding(self, finding: dict[str, Any]) -> bool:
        """Record a finding unless one for the same step is already there; True when added."""
        if self._finding_keys is None or len(self._finding_keys) != len(self.findings):
            self._finding_keys = {_finding_key(existing) for existing in self.findings}
        key = _finding_key(finding)
        if key in self._finding_keys:  # a set: a rule firing at every step costs O(1) per finding
            return False
        if len(self.findings) >= MAX_KEPT_FINDINGS:
            self.dropped_findings += 1
            return True
        self.findings.append(finding)
        self._finding_keys.add(key)
        return True

    def add_missing(self, what: str, collection: str | None) -> bool:
        entry = {"what": what, "collection": collection}
        if entry in self.missing or len(self.missing) >= MAX_KEPT_MISSING:
            return False
        # The same collection missing at every step is one problem, not one per step.
        if collection is not None and any(item.get("collection") == collection for item in self.missing):
            return False
        self.missing.append(entry)
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "configuration_name": self.configuration_name,
            "rule": self.rule,
            "status": self.status,
            "status_details": self.status_details,
            "last_evaluated_step": self.last_evaluated_step,
            "findings": self.findings,
            "dropped_findings": self.dropped_findings,
            "missing": self.missing,
            "finished": self.finished,
            "error": self.error,
            "evaluated": self.evaluated,
            "not_evaluated": self.not_evaluated,
            "statistics": self.statistics,
            "not_applicable": self.not_applicable,
            "worker_steps": self.worker_steps,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuleProgress:
        step = data.get("last_evaluated_step")
        return cls(
            configuration_name=str(data["configuration_name"]),
            rule=str(data.get("rule") or data["configuration_name"]),
            status=str(data.get("status") or "InProgress"),
            status_details=str(data.get("status_details") or ""),
            last_evaluated_step=None if step is None else int(step),
            findings=list(data.get("findings") or []),
            dropped_findings=int(data.get("dropped_findings") or 0),
            missing=list(data.get("missing") or []),
            finished=bool(data.get("finished")),
            error=bool(data.get("error")),
            # files written before "evaluated" existed: a rule that got past a step evaluated
            evaluated=bool(data["evaluated"]) if "evaluated" in data else step is not None,
            not_evaluated=str(data.get("not_evaluated") or ""),
            statistics=data["statistics"] if isinstance(data.get("statistics"), dict) else None,
            not_applicable=bool(data.get("not_applicable")),
            worker_steps=(
                {str(worker): int(step) for worker, step in data["worker_steps"].items()}
                if isinstance(data.get("worker_steps"), dict) else None
            ),
        )  # fmt: skip


def _finding_key(finding: dict[str, Any]) -> tuple[Any, ...]:
    """Findings are the same when step, message and worker are (a restart re-finds them)."""
    return (finding.get("step"), finding.get("message"), finding.get("worker"))


def write_json_atomic(path: str | os.PathLike[str], document: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never a partial one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # json.dumps without indent runs the C encoder; json.dump to a file never does (a rule-output
        # file of 1,000 findings took 0.2 s with indent=1, rewritten on every finding)
        text = json.dumps(document, default=str, separators=(",", ":"))
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def load_progress(path: str | os.PathLike[str], trial_path: str) -> dict[str, RuleProgress]:
    """The saved state per configuration name; empty when the file does not exist yet.

    Raises:
        ConfigError: the file is not a progress file, or belongs to another run.
    """
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"progress file {path} is unreadable ({error}); delete it to start over") from None
    if not isinstance(document, dict) or document.get("version") != PROGRESS_VERSION:
        raise ConfigError(f"progress file {path} is not a trainguard rule progress file (version {PROGRESS_VERSION})")
    saved_trial = document.get("trial")
    if saved_trial and saved_trial.rstrip("/") != trial_path.rstrip("/"):
        raise ConfigError(
            f"progress file {path} belongs to the run {saved_trial}, not {trial_path}: use another --progress file"
        )
    try:
        return {name: RuleProgress.from_dict(data) for name, data in (document.get("rules") or {}).items()}
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"progress file {path} is corrupt ({error}); delete it to start over") from None


def write_progress(path: str | os.PathLike[str], trial_path: str, rules: dict[str, RuleProgress]) -> None:
    write_json_atomic(
        path,
        {
            "version": PROGRESS_VERSION,
            "trial": trial_path,
            "updated_at": time.time(),
            "rules": {name: progress.to_dict() for name, progress in rules.items()},
        },
    )


def rule_output_key(progress: RuleProgress) -> str:
    """``rule-output/<RuleConfigurationName>.json``, relative to the output location."""
    name = progress.configuration_name
    if "/" in name or name in {"", ".", ".."}:
        raise ConfigError(f"rule configuration name {name!r} cannot be a file name: use letters, digits and dashes")
    return f"{RULE_OUTPUT_DIR}/{name}.json"


def rule_output_document(progress: RuleProgress, diagnosis: dict[str, Any] | None = None) -> dict[str, Any]:
    """A rule's rule-output file, in the shared format (read by reports and summaries).

    ``diagnosis`` (see :mod:`trainguard.rules.diagnosis`) leads the document: the run's primary
    finding and its fix, and this rule's place in it, before the rule's own findings."""
    head: dict[str, Any] = {"diagnosis": diagnosis} if diagnosis is not None else {}
    return {
        **head,
        "configuration_name": progress.configuration_name,
        "rule": progress.rule,
        "status": progress.status,
        "status_details": progress.status_details,
        "last_evaluated_step": progress.last_evaluated_step,
        "findings": progress.findings,
        "dropped_findings": progress.dropped_findings,
        "missing": progress.missing,
        **({"statistics": progress.statistics} if progress.statistics is not None else {}),
        # status Error + RuleNotEvaluated of a rule that does not apply to the run by its design
        "not_applicable": progress.not_applicable and progress.status == "Error" and not progress.error,
        "updated_at": time.time(),
    }


def write_rule_output(
    output_dir: str | os.PathLike[str], progress: RuleProgress, diagnosis: dict[str, Any] | None = None
) -> Path:
    """``<output_dir>/rule-output/<RuleConfigurationName>.json`` in a local directory."""
    path = Path(output_dir) / rule_output_key(progress)
    write_json_atomic(path, rule_output_document(progress, diagnosis))
    return path
