"""What a rule runner does with its rules' results: statuses, findings, the run's diagnosis, the
progress file and the rule-output files. :class:`trainguard.rules.runner.RuleRunner` has one
:class:`RunnerResults` and hands it every result; this part owns the latest update per
configuration and what is still to be written, and shares the runner's ``progress`` (the runner
loads it and moves the cursors, this part records what the rules said)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from trainguard.errors import StorageError
from trainguard.rules.advice import advice_details
from trainguard.rules.base import RuleStatus, StepResult
from trainguard.rules.diagnosis import diagnose, finding_kind, role_of
from trainguard.rules.progress import (
    RuleProgress,
    rule_output_document,
    rule_output_key,
    write_progress,
    write_rule_output,
)
from trainguard.rules.status_update import StatusUpdate

__all__ = ["OUTPUT_INTERVAL", "RunnerResults", "issue_steps"]

logger = logging.getLogger("trainguard.rules")

# Seconds between rewrites of a rule's rule-output file while only its last evaluated step moves.
OUTPUT_INTERVAL = 1.0


def issue_steps(findings: list[dict[str, Any]]) -> set[int]:
    """The steps of the findings that are issues (fired and not advice)."""
    return {int(f["step"]) for f in findings if f.get("fired") and not f.get("advice")}


class RunnerResults:
    """Statuses, findings and their files for one :class:`~trainguard.rules.runner.RuleRunner`.

    Args:
        progress: the runner's state per configuration (the same dict, not a copy).
        trial_path: the run, as the progress file names it.
        progress_file: JSON file the progress is saved to, or None.
        progress_interval: at most this often (seconds) the progress file is rewritten for steps
            without findings.
        output_dir: where ``rule-output/<name>.json`` goes (a directory or ``s3://`` prefix).
        endpoint_url: S3-compatible endpoint for an ``s3://`` output_dir.
        stop_on_fire: configuration -> whether its actions stop training on a certain finding.
        on_update: called with every :class:`StatusUpdate` (a broken callback is logged only).
    """

    def __init__(
        self,
        progress: dict[str, RuleProgress],
        *,
        trial_path: str,
        progress_file: str | None,
        progress_interval: float,
        output_dir: str,
        endpoint_url: str | None,
        stop_on_fire: Mapping[str, bool],
        on_update: Callable[[StatusUpdate], None] | None,
    ) -> None:
        self.progress = progress
        self.trial_path = trial_path
        self.progress_file = progress_file
        self.progress_interval = progress_interval
        self.output_dir = output_dir
        self.endpoint_url = endpoint_url
        self.on_update = on_update
        self.latest: dict[str, StatusUpdate] = {}
        self._stop_on_fire = dict(stop_on_fire)
        self._output_store: Any = None
        self._last_save = 0.0
        self._last_output = 0.0
        self._progress_dirty = False  # the progress file is behind
        self._dirty: set[str] = set()  # configurations whose rule-output file is behind
        self._save_failure_logged: object = None
        # the first finding per (kind, worker, certain, advice) of each configuration, and the
        # diagnosis from them
        self._first_findings: dict[str, dict[tuple[str, str | None, bool, bool], dict[str, Any]]] = {}
        self._diagnosis: dict[str, Any] | None = None
        self._diagnosis_stale = True

    def step_evaluated(self, name: str) -> None:
        """The runner moved ``name``'s cursor: its progress and rule-output file are due."""
        self._dirty.add(name)
        self._progress_dirty = True

    # -- results -------------------------------------------------------------------------------
    def record(self, name: str, result: StepResult | None) -> None:
        if result is None:
            return
        state = self.progress[name]
        if result.not_evaluated is not None:
            # "does not apply" is the rule's word about the run's design: it outranks an earlier
            # "could not evaluate yet" reason
            if not state.not_evaluated or (result.not_applicable and not state.not_applicable):
                state.not_evaluated = result.not_evaluated
                state.not_applicable = result.not_applicable
                self._progress_dirty = True
            return
        if result.missing:
            new = [m for m in result.missing if state.add_missing(m.what, m.collection)]
            if new:
                details = "Missing data: " + "; ".join(m.describe() for m in new)
                if not state.fired_steps:
                    state.status_details = details
                self.emit(name, RuleStatus(state.status), details, result)
                self.save(force=True)
            return
        if not state.evaluated:
            state.evaluated = True
            self._progress_dirty = True
        if not result.fired:
            self._keep_statistics(name, result)
            return
        finding = result.to_dict()
        if not state.add_finding(finding):
            return  # already recorded before a restart
        self.note_finding(name, finding)
        if result.advice:
            self._record_advice(name, result)
            return
        details = result.condition_met_details()
        first = state.status != RuleStatus.ISSUES_FOUND.value
        if first:
            state.status_details = details
        state.status = RuleStatus.ISSUES_FOUND.value
        if self._stop_on_fire.get(name) and result.certain:
            state.finished = True  # its action stops training: nothing more to evaluate
        self.emit(name, RuleStatus.ISSUES_FOUND, details, result)
        # The first finding (a transition) and a stop are saved at once; later findings of a rule
        # that keeps firing with the progress (every progress_interval) and the output file (every
        # OUTPUT_INTERVAL): rewriting files of up to 1,000 findings on every step was quadratic.
        self.save(force=first or state.finished)

    def _keep_statistics(self, name: str, result: StepResult) -> None:
        """A no-issue result's ``details["statistics"]`` (OverallSystemUsage's percentiles per
        resource) become the rule's statistics: in its rule-output file, its updates, the summary."""
        statistics = result.details.get("statistics") if result.details else None
        state = self.progress[name]
        if isinstance(statistics, dict) and statistics != state.statistics:
            state.statistics = dict(statistics)
            self._dirty.add(name)

    def _record_advice(self, name: str, result: StepResult) -> None:
        """Advice is kept and reported, but it is no issue: the status stays what it was (InProgress,
        or IssuesFound from a real finding) and ends NoIssuesFound with ``Advice: ...`` details."""
        state = self.progress[name]
        first = not issue_steps(state.findings) and not state.status_details.startswith("Advice:")
        if first:
            state.status_details = advice_details([result.to_dict()])
        self.emit(name, RuleStatus(state.status), state.status_details, result)
        self.save(force=first)

    def final_details(self, name: str) -> tuple[RuleStatus, str] | None:
        """IssuesFound with the first real finding, or NoIssuesFound with the first advice; None
        when the rule found neither."""
        state = self.progress[name]
        if issue_steps(state.findings):
            return RuleStatus.ISSUES_FOUND, self.first_fired_details(name)
        advice: list[Mapping[str, Any]] = sorted(
            (f for f in state.findings if f.get("fired") and f.get("advice")), key=lambda f: f["step"]
        )
        if advice:
            return RuleStatus.NO_ISSUES_FOUND, advice_details(advice)
        return None

    def first_fired_details(self, name: str) -> str:
        state = self.progress[name]
        first = min(issue_steps(state.findings))
        return (
            f"RuleEvaluationConditionMet: Evaluation of the rule {state.rule} at step {first} "
            "resulted in the condition being met\n"
        )

    def rule_failed(self, name: str, error: BaseException, where: str) -> None:
        logger.warning("trainguard rules: %s raised %s %s", name, type(error).__name__, where, exc_info=error)
        self.progress[name].finished = True
        self.set_error(name, f"{type(error).__name__}: {error} ({where})")

    def set_error(self, name: str, details: str) -> None:
        state = self.progress[name]
        state.error = True
        state.finished = True
        self.set_status(name, RuleStatus.ERROR, details[:1024])

    def set_status(self, name: str, status: RuleStatus, details: str) -> None:
        state = self.progress[name]
        latest = self.latest.get(name)
        changed = (
            latest is None
            or latest.status != status
            or latest.status_details != details
            or latest.result is not None  # the final word is a status, not a finding
            or latest.last_evaluated_step != state.last_evaluated_step
        )
        state.status, state.status_details = status.value, details
        self._diagnosis_stale = True  # a rule that ends not evaluated is in the diagnosis
        self._dirty.add(name)
        if changed:
            self.emit(name, status, details)

    def emit(self, name: str, status: RuleStatus, details: str, result: StepResult | None = None) -> None:
        state = self.progress[name]
        state.status = status.value
        update = StatusUpdate(
            configuration_name=name,
            rule=state.rule,
            status=status,
            status_details=details,
            step=result.step if result is not None else state.last_evaluated_step,
            result=result,
            last_evaluated_step=state.last_evaluated_step,
            statistics=state.statistics,
            not_applicable=state.not_applicable and status == RuleStatus.ERROR and not state.error,
        )
        self.latest[name] = update
        self._dirty.add(name)
        if self.on_update is not None:
            try:
                self.on_update(update)
            except Exception:  # noqa: BLE001 - a broken callback must not stop rule evaluation
                logger.exception("trainguard rules: on_update callback failed for %s", name)

    # -- persistence ---------------------------------------------------------------------------
    def save(self, force: bool = False) -> None:
        """Progress file at most every ``progress_interval`` s (at once when ``force``); the
        rule-output files of rules that changed on ``force`` (a status or finding) and otherwise
        at most every ``OUTPUT_INTERVAL`` s: they are for people and reports, not for resuming."""
        now = time.monotonic()
        if not force and now - self._last_save < self.progress_interval:
            return
        self._last_save = now
        try:
            if self.progress_file and (self._dirty or self._progress_dirty):
                write_progress(self.progress_file, self.trial_path, self.progress)
                self._progress_dirty = False
            if self.output_dir and self._dirty and (force or now - self._last_output >= OUTPUT_INTERVAL):
                self._last_output = now
                # Every file leads with the run's diagnosis: when it changed, every file is rewritten.
                before = self._diagnosis
                diagnosis = self.diagnosis()
                names = sorted(self.progress) if diagnosis != before else sorted(self._dirty)
                for name in names:
                    self._write_output(self.progress[name], diagnosis)
                self._dirty.clear()
        except (OSError, StorageError) as error:  # never stop evaluating over a file we keep for people
            # said once per kind of failure: a read-only run would repeat it at every save
            kind = getattr(error, "errno", None) or type(error).__name__
            if self._save_failure_logged != kind:
                self._save_failure_logged = kind
                logger.warning("trainguard rules: cannot save rule progress or output (not repeated): %s", error)
            else:
                logger.debug("trainguard rules: cannot save rule progress or output: %s", error)

    def diagnosis(self) -> dict[str, Any]:
        """The run's diagnosis so far over every configuration (see :mod:`trainguard.rules.diagnosis`).

        Computed from each rule's first finding per kind and worker (all the diagnosis looks at),
        and only again after one of those or a status changed: a rule that fires at every step
        costs no more per step on a long run than on a short one."""
        if self._diagnosis is None or self._diagnosis_stale:
            results = []
            for name, progress in self.progress.items():
                document = progress.to_dict()
                document["findings"] = list(self._first_findings.get(name, {}).values())
                results.append(document)
            self._diagnosis, self._diagnosis_stale = diagnose(results), False
        return self._diagnosis

    def note_finding(self, name: str, finding: dict[str, Any]) -> None:
        firsts = self._first_findings.setdefault(name, {})
        # the first certain finding too: the diagnosis leads with the cause of the earliest certain one
        kind = finding_kind({**finding, "rule": self.progress[name].rule})
        key = (kind, finding.get("worker"), bool(finding.get("certain")), bool(finding.get("advice")))
        known = firsts.get(key)
        if known is None or int(finding.get("step", 0)) < int(known.get("step", 0)):
            firsts[key] = finding
            self._diagnosis_stale = True

    def _write_output(self, progress: RuleProgress, diagnosis: dict[str, Any] | None = None) -> None:
        from trainguard.storage import is_remote, open_store

        if diagnosis is not None:
            diagnosis = {**diagnosis, "this_rule": role_of(diagnosis, progress.rule)}
        if not is_remote(self.output_dir):
            write_rule_output(self.output_dir, progress, diagnosis)
            return
        if self._output_store is None:
            self._output_store = open_store(self.output_dir, endpoint_url=self.endpoint_url)
        document = json.dumps(rule_output_document(progress, diagnosis), default=str, separators=(",", ":")).encode()
        self._output_store.write(rule_output_key(progress), document)
