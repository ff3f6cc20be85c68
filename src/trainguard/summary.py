"""A short human summary of a run: steps, tensors, sizes, where, and what the rules found."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.errors import TrainguardError
from trainguard.format.layout import EVENTS_PREFIX, RUN_EXIT_RECORD
from trainguard.modes import ModeKeys
from trainguard.trial import Trial, create_trial

__all__ = [
    "describe_run", "format_bytes", "is_not_applicable", "is_not_evaluated", "print_summary", "read_rule_results",
    "render_rule_results", "rule_results_from_updates",
]  # fmt: skip

RULE_OUTPUT_PREFIX = "rule-output/"
STOP_RECORD = "trainguard-stop.json"
_FINDINGS_SHOWN = 3
_NOT_EVALUATED = "RuleNotEvaluated:"


def format_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"


def describe_run(trial: Trial) -> dict[str, Any]:
    """Facts about a run, cheap to compute (sizes come from the index, not from reading data)."""
    state = trial._state
    event_bytes = sum(
        entry.length for record in state.steps.values() for index in record.workers.values() for entry in index.tensors
    )
    per_mode = {mode.name: len(trial.steps(mode)) for mode in trial.modes()}
    names = trial.tensor_names()
    by_collection = {
        name: len(trial.tensor_names(collection=name))
        for name in ("weights", "biases", "gradients", "losses", "outputs")
        if name in trial.collections()
    }
    return {
        "path": trial.path,
        "steps": len(trial.steps()),
        "steps_per_mode": per_mode,
        "tensors": len(names),
        "tensors_per_collection": {k: v for k, v in by_collection.items() if v},
        "reduction_tensors": len(trial.tensor_names(show_prefixed_tensors=True)) - len(names),
        "bytes": event_bytes,
        "workers": trial.workers(),
        "ended": trial.training_ended,
        "event_files_prefix": f"{trial.path.rstrip('/')}/{EVENTS_PREFIX}",
        "first_step": min(trial.steps(), default=None),
        "last_step": max(trial.steps(), default=None),
        "loss_names": trial.tensor_names(collection="losses") if "losses" in trial.collections() else [],
        "modes": [mode.name for mode in trial.modes() if mode != ModeKeys.GLOBAL],
        "rules": read_rule_results(trial.store),
        "stopped": _read_json(trial.store, STOP_RECORD),
        # how the training command ended, written by trainguard run (None: not run under it)
        "exit": _read_json(trial.store, RUN_EXIT_RECORD),
        "capture_stopped": trial.capture_stopped(),
        "damaged": [
            {"step": item.step, "worker": item.worker, "file": item.key, "problem": item.problem}
            for item in trial.damage()
        ],
    }


def _read_json(store: Any, key: str) -> Any:
    try:
        return json.loads(store.read(key))
    except Exception:  # noqa: BLE001 - a summary shows what it can read
        return None


def read_rule_results(store: Any) -> list[dict[str, Any]]:
    """The ``rule-output/<name>.json`` files rule runners wrote into the run, by name."""
    try:
        keys = [key for key in store.list(RULE_OUTPUT_PREFIX) if key.endswith(".json") and key.count("/") == 1]
    except Exception:  # noqa: BLE001
        return []
    results = [data for key in sorted(keys) if isinstance(data := _read_json(store, key), dict)]
    return results


def rule_results_from_updates(latest: Mapping[str, Any], findings: Sequence[Any]) -> list[dict[str, Any]]:
    """The same shape as the rule-output files, from a runner's StatusUpdates."""
    results = []
    for name, update in latest.items():
        fired = [f.result.to_dict() for f in findings if f.configuration_name == name and f.result is not None]
        results.append(
            {
                "configuration_name": name,
                "rule": update.rule,
                "status": getattr(update.status, "value", update.status),
                "status_details": update.status_details,
                "last_evaluated_step": update.last_evaluated_step,
                **({"statistics": update.statistics} if getattr(update, "statistics", None) else {}),
                "not_applicable": bool(getattr(update, "not_applicable", False)),
                "findings": sorted(fired, key=lambda f: f["step"]),
            }
        )
    return results


def is_not_evaluated(result: Mapping[str, Any]) -> bool:
    """A rule result whose rule could not evaluate the run (Error, ``RuleNotEvaluated: ...``)."""
    details = str(result.get("status_details") or "").lstrip()
    return result.get("status") == "Error" and details.startswith(_NOT_EVALUATED)


def is_not_applicable(result: Mapping[str, Any]) -> bool:
    """A not-evaluated rule that does not apply to the run by its design (the runner's structured
    ``not_applicable``: an XGBoost rule on a PyTorch run, no tanh for SaturatedActivation), as
    opposed to one that could not evaluate data that should be there."""
    return is_not_evaluated(result) and bool(result.get("not_applicable"))


def render_rule_results(results: Sequence[Mapping[str, Any]], stopped: Mapping[str, Any] | None = None) -> str:
    """The diagnosis first (primary finding and its fix, what it explains), then each rule: its
    status, and each finding with its step, worker and fix hint."""
    from trainguard.rules.diagnosis import diagnose, names_workers, render_diagnosis

    if not results:
        return ""
    with_issues = [r for r in results if r.get("status") == "IssuesFound"]
    inapplicable = [r for r in results if is_not_applicable(r)]
    not_evaluated = [r for r in results if is_not_evaluated(r) and not is_not_applicable(r)]
    # advice (a property of the data or the initialisation, trainguard.rules.advice) is counted
    # apart: it is not an issue, and "0 found issues" must stay true of a run that only got advice
    advised = [r for r in results if r.get("status") != "IssuesFound" and _advice(r)]
    head = f"  rules       : {len(results)} run, {len(with_issues)} found issues"
    head += f", {len(advised)} gave advice" if advised else ""
    head += f", {len(inapplicable)} not applicable" if inapplicable else ""
    lines = [head + (f", {len(not_evaluated)} not evaluated" if not_evaluated else "")]
    diagnosis = diagnose(results)
    diagnosis["not_evaluated"] = []  # listed with their rule below
    lines.extend(render_diagnosis(diagnosis))
    width = max((len(str(r.get("configuration_name"))) for r in results if not is_not_applicable(r)), default=0)
    show_workers = names_workers(f for r in results for f in r.get("findings") or [] if f.get("fired"))
    for result in results:
        name, status = str(result.get("configuration_name")), str(result.get("status"))
        fired = [f for f in result.get("findings") or [] if f.get("fired")]
        if is_not_applicable(result):
            continue  # counted in one line below
        if is_not_evaluated(result):
            why = str(result.get("status_details")).strip()[len(_NOT_EVALUATED) :].strip()
            lines.append(f"    {name:<{width}}  not evaluated (Error): {why}")
            continue
        advice = _advice(result)
        if advice and len(advice) == len(fired):
            first = advice[0]
            lines.append(f"    {name:<{width}}  {status}, advice at step {first.get('step')}: {first.get('message')}")
            continue
        fired = [f for f in fired if not f.get("advice")]
        if not fired:
            details = str(result.get("status_details") or "").strip()
            lines.append(
                f"    {name:<{width}}  {status}" + (f" ({details})" if details and status != "IssuesFound" else "")
            )
            lines.extend(_statistics_lines(result))
            continue
        lines.append(f"    {name:<{width}}  {status}: {len(fired)} finding(s), first at step {fired[0].get('step')}")
        for finding in fired[:_FINDINGS_SHOWN]:
            worker = f" ({finding.get('worker')})" if show_workers and finding.get("worker") else ""
            lines.append(f"      step {finding.get('step')}{worker}: {finding.get('message')}")
        if len(fired) > _FINDINGS_SHOWN:
            lines.append(f"      ... and {len(fired) - _FINDINGS_SHOWN} more")
        hint = next((f.get("fix_hint") for f in fired if f.get("fix_hint")), "")
        if hint:
            lines.append(f"      fix: {hint}")
    if inapplicable:
        names = ", ".join(str(r.get("configuration_name")) for r in inapplicable)
        rules = "rule" if len(inapplicable) == 1 else "rules"
        lines.append(f"    {len(inapplicable)} {rules} not applicable to this run: {names}")
    if stopped:
        lines.append(_stopped_line(stopped))
    return "\n".join(lines)


def _statistics_lines(result: Mapping[str, Any]) -> list[str]:
    statistics = result.get("statistics")
    if not isinstance(statistics, Mapping) or not statistics:
        return []
    from trainguard.rules.builtin.overall_system_usage import render_statistics

    return [f"      {line}" for line in render_statistics(statistics)]


def _advice(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [f for f in result.get("findings") or [] if f.get("fired") and f.get("advice")]


def _stopped_line(stopped: Mapping[str, Any]) -> str:
    """The stop names the diagnosis' primary finding; the certain finding that triggered it is
    named after it when it is another one (``trainguard-stop.json``, see rules.autostop)."""
    delay = ""
    if stopped.get("stopped_at") and stopped.get("finding_reported_at"):
        delay = f", {float(stopped['stopped_at']) - float(stopped['finding_reported_at']):.1f} s after the finding"
    trigger = stopped.get("triggered_by") or {}
    by = ""
    if trigger and trigger.get("configuration_name") != stopped.get("configuration_name"):
        by = f" (the diagnosis; triggered by {trigger.get('configuration_name')}'s certain finding)"
    name = stopped.get("configuration_name")
    return f"  stopped     : training was stopped by {name} at step {stopped.get('step')}{by}{delay}"


def _finished(facts: Mapping[str, object]) -> str:
    """How training ended: stopped by a rule (``trainguard-stop.json``), the command's exit status
    (``trainguard-exit.json``, written by ``trainguard run``), else the hook's end marker."""
    cut = ", but its capture stopped early (see capture)" if facts.get("capture_stopped") else ""
    stopped = facts.get("stopped")
    if isinstance(stopped, Mapping) and stopped.get("configuration_name"):
        return f"no: stopped by {stopped['configuration_name']} at step {stopped.get('step')}"
    record = facts.get("exit")
    if isinstance(record, Mapping) and "returncode" in record:
        code = record["returncode"]
        if code is None:  # trainguard run writes it at the start: the command has not exited
            if facts["ended"]:
                return "training ended (its capture closed); the command has not exited yet"
            return "no: still running (or trainguard run was killed before recording its exit)"
        if isinstance(code, int) and code != 0:
            return f"no: crashed ({_exit_status(code)})" + cut
        if code == 0:
            return ("yes" if facts["ended"] else "training ended") + cut
    if cut:
        return ("yes" if facts["ended"] else "training ended") + cut
    return "yes" if facts["ended"] else "no (run still live or crashed)"


def _exit_status(code: int) -> str:
    """A negative return code is a signal (subprocess's convention)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}, exit status {128 - code}"
    return f"exit status {code}"


def render_summary(facts: Mapping[str, Any]) -> str:
    modes = ", ".join(f"{mode} {count}" for mode, count in facts["steps_per_mode"].items())
    collections = ", ".join(f"{name} {count}" for name, count in facts["tensors_per_collection"].items())
    lines = [
        f"trainguard: captured run at {facts['path']}",
        f"  steps saved : {facts['steps']} ({modes}), global steps {facts['first_step']}..{facts['last_step']}",
        f"  tensors     : {facts['tensors']} ({collections})"
        + (f" + {facts['reduction_tensors']} reductions" if facts["reduction_tensors"] else ""),
        f"  data        : {format_bytes(int(facts['bytes']))} in event files, workers {', '.join(facts['workers'])}",
        f"  losses      : {', '.join(facts['loss_names']) or 'none captured'}",
        f"  finished    : {_finished(facts)}",
        f"  read it     : from trainguard.trials import create_trial; create_trial({str(facts['path'])!r})",
    ]
    for worker, why in (facts.get("capture_stopped") or {}).items():
        lines.append(
            f"  capture     : STOPPED EARLY: {worker} captured nothing from step {why.get('step')} on "
            f"(steps saved end at {facts['last_step']}): {why.get('reason')}"
        )
    for item in facts.get("damaged") or []:
        where = "" if item.get("step") is None else f"step {item['step']} of {item.get('worker')}: "
        lines.append(f"  damaged     : {where}{item.get('file')}: {item.get('problem')}")
    rules = render_rule_results(facts.get("rules") or [], facts.get("stopped"))
    if rules:
        lines.append(rules)
    return "\n".join(lines)


def print_summary(
    path: str,
    as_json: bool = False,
    rules: list[dict[str, Any]] | None = None,
    stopped: dict[str, Any] | None = None,
    returncode: int | None = None,
    strict: bool = False,
) -> None:
    """``strict`` (the summary verb): a run that cannot be read is an error (exit 2); after
    ``trainguard run`` it is one line, since training's own status is the answer then."""
    try:
        trial = create_trial(path, collection_wait_timeout=0)
    except TrainguardError as error:
        if strict:
            raise
        print(f"trainguard: nothing captured at {path}: {error}", file=sys.stderr)
        if rules:
            print(render_rule_results(rules, stopped), flush=True)
        return
    facts = describe_run(trial)
    if rules is not None:  # what the runner reported beats files (an s3:// run has none locally)
        facts["rules"] = rules
    if stopped is not None:
        facts["stopped"] = dict(stopped)
    if returncode is not None:  # an s3:// run has no local exit record
        facts["exit"] = {"returncode": returncode}
    print(json.dumps(facts, indent=2, default=str) if as_json else render_summary(facts), flush=True)
