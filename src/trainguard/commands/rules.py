"""``trainguard rules``: run rules on a run (live or finished), list and describe them.

    trainguard rules run PATH [--rule NAME[:key=value,...] ...] [--start-step N] [--end-step N]
                          [--json] [--progress FILE] [--output-dir DIR]
                          [--endpoint-url URL] [--profile NAME] [--region REGION]
    trainguard rules list [--json]
    trainguard rules describe NAME

``rules run`` exits 0 when every rule evaluated the run and none found an issue, 1 when one
found an issue (advice is no issue: ``trainguard.rules.advice``), 2 on an error (a rule that crashed,
a run that did not appear, bad arguments),
and 4 when no rule found an issue but at least one rule named with ``--rule`` could not evaluate
the run (status Error, details ``RuleNotEvaluated: <why>``: its data is missing) unless
``--allow-not-evaluated``. Without ``--rule`` the default set runs (the one ``trainguard run
--rules`` uses); those of its rules that cannot apply to the run leave the exit status alone. A
local PATH that does not exist exits 2 at once. In that
order: 2 before 1 before 4. A damaged run (a truncated or missing index, an index entry without
the payload checksum its writer promised, a corrupt record: ``Trial.damage()``) exits 2 whatever
the rules found, after one line per damaged file naming its step (``trainguard rules: damaged:
step N of worker_0: <file>: <problem>``; on stderr, so ``--json`` output stays JSON lines). With
``--json`` the last line is ``{"diagnosis": {...}}`` (the primary
finding with its fix, its consequences, the other findings and the rules not evaluated; see
:mod:`trainguard.rules.diagnosis`); without it, the final table ends with the same diagnosis.

``rules list`` and ``rules describe`` are in :mod:`trainguard.commands._rules_catalog`; this module
registers them and holds ``rules run``: its arguments, the rule list, the output and exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any, TextIO

from trainguard.commands._rules_catalog import describe_rule, list_rules
from trainguard.errors import ConfigError, TrainguardError
from trainguard.storage import require_local_path
from trainguard.storage.options import add_storage_arguments

__all__ = [
    "EXIT_NOT_EVALUATED", "add_run_arguments", "exit_code", "is_not_evaluated", "module_main", "parse_rule_list",
    "register", "run_rules",
]  # fmt: skip

EXIT_NO_ISSUES, EXIT_ISSUES, EXIT_ERROR, EXIT_NOT_EVALUATED = 0, 1, 2, 4
NOT_EVALUATED_PREFIX = "RuleNotEvaluated:"


def parse_rule_list(text: str) -> list[Any]:
    """``A,B:key=v,key2=v2,pkg.mod:Class`` → RuleSpecs.

    A comma-separated item without ``=`` (or with a ``:`` before its ``=``) starts a new rule;
    ``key=value`` items belong to the rule before them.
    """
    from trainguard.rules.spec import RuleSpec

    groups: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        colon, equals = item.find(":"), item.find("=")
        starts_rule = equals < 0 or (0 <= colon < equals)
        if starts_rule:
            groups.append(item)
        elif groups:
            groups[-1] += "," + item
        else:
            raise ConfigError(f"--rules {text!r}: {item!r} comes before any rule name; write NAME:{item}")
    return [RuleSpec.parse(group) for group in groups]


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="the run: the hook's out_dir (directory or s3://bucket/prefix)")
    parser.add_argument(
        "--rule", action="append", default=[], metavar="NAME[:key=value,...]",
        help="a rule to run (repeatable); NAME is a built-in, a plug-in, or package.module:Class; "
        "default: the default set",
    )  # fmt: skip
    parser.add_argument("--specs-json", help=argparse.SUPPRESS)  # full RuleSpecs (with actions), for trainguard run
    parser.add_argument("--start-step", type=int, help="first global step to evaluate")
    parser.add_argument("--end-step", type=int, help="evaluate steps before this one (exclusive)")
    parser.add_argument("--json", action="store_true", help="print one JSON StatusUpdate per line")
    parser.add_argument("--progress", help="progress file: resume from it and keep it up to date")
    parser.add_argument("--output-dir", help="write rule-output/<name>.json here (default: the run dir if local)")
    add_storage_arguments(parser)
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between polls (default 0.5)")
    parser.add_argument(
        "--wait-timeout", type=float, default=120.0, help="seconds to wait for the run to appear (default 120)"
    )
    parser.add_argument(
        "--allow-not-evaluated", action="store_true",
        help="exit 0, not 4, when a rule could not evaluate the run (its data is missing) and none found an issue",
    )  # fmt: skip
    parser.add_argument("--end-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    # trainguard run: evaluate as batch work at this nice value, so that training comes first
    parser.add_argument("--background-nice", type=int, choices=range(20), help=argparse.SUPPRESS)


def _specs_from_args(args: argparse.Namespace) -> list[Any]:
    from trainguard.rules.spec import RuleSpec

    specs = [RuleSpec.parse(text) for text in args.rule]
    if args.specs_json:
        for item in json.loads(args.specs_json):
            specs.append(
                RuleSpec(
                    rule=item["rule"],
                    parameters=item.get("parameters") or {},
                    configuration_name=item.get("configuration_name") or "",
                    actions=tuple(item.get("actions") or ()),
                )
            )
    # The rules the user named: only these fail the exit status when they cannot evaluate the
    # run. With none named, the default set (as ``trainguard run --rules``), some of which cannot
    # apply to a given run (XGBoost rules on a PyTorch run, image rules without images).
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"--rule: two configurations are named {', '.join(map(repr, twice))}; give each its own "
                          "name (RULE:name=NAME,...)")  # fmt: skip
    args.named_rules = set(names)
    if not specs:
        from trainguard.rules.defaults import default_rule_specs

        specs = default_rule_specs()
    return specs


def is_not_evaluated(status: Any, details: Any) -> bool:
    """Whether a final status says "could not evaluate" (Error + RuleNotEvaluated details)."""
    return getattr(status, "value", status) == "Error" and str(details or "").lstrip().startswith(NOT_EVALUATED_PREFIX)


def exit_code(
    final: dict[str, Any], allow_not_evaluated: bool = False, named: set[str] | frozenset[str] | None = None
) -> int:
    """2 (a real error, or stopped), else 1 (issues), else 4 (not evaluated, unless allowed), else 0.

    ``named``: the configurations whose "not evaluated" counts (the rules the user named); None:
    every one. A rule of the default set that cannot apply to the run leaves the status alone.
    """
    statuses = set()
    not_evaluated = False
    for name, update in final.items():
        if is_not_evaluated(update.status, update.status_details):
            not_evaluated = not_evaluated or named is None or name in named
        else:
            statuses.add(getattr(update.status, "value", update.status))
    if "Error" in statuses or not final:
        return EXIT_ERROR
    if "IssuesFound" in statuses:
        return EXIT_ISSUES
    if "Stopped" in statuses:
        return EXIT_ERROR
    if not_evaluated and not allow_not_evaluated:
        return EXIT_NOT_EVALUATED
    return EXIT_NO_ISSUES


def status_label(status: Any, details: Any) -> str:
    """The status as people read it: "not evaluated" rather than a bare Error."""
    value = getattr(status, "value", status)
    return "NotEvaluated" if is_not_evaluated(value, details) else str(value)


def format_update(update: Any) -> str:
    """One human line (two with a fix hint) for a StatusUpdate."""
    status = getattr(update.status, "value", update.status)
    head = f"trainguard rules: {update.configuration_name}: {status}"
    if is_not_evaluated(status, update.status_details):
        why = str(update.status_details).strip()[len(NOT_EVALUATED_PREFIX) :].strip()
        return f"trainguard rules: {update.configuration_name}: not evaluated (Error): {why}"
    result = update.result
    if result is not None and result.fired:
        where = f" on {result.worker}" if result.worker else ""
        certainty = "" if result.certain else " (not certain)"
        if result.advice:  # a property of the data or the initialisation: not an issue
            head, certainty = f"trainguard rules: {update.configuration_name}: advice", ""
        text = f"{head} at step {result.step}{where}{certainty}: {result.message}"
        return text + (f"\n    fix: {result.fix_hint}" if result.fix_hint else "")
    details = (update.status_details or "").strip()
    if status == "InProgress" and not details:
        return (
            f"{head} (from step {update.last_evaluated_step + 1})" if update.last_evaluated_step is not None else head
        )
    return f"{head}" + (f": {details}" if details else "")


def run_rules(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from trainguard.rules.runner import RuleRunner

    if getattr(args, "background_nice", None) is not None:
        from trainguard.priority import yield_to_training

        yield_to_training(args.background_nice)
    out = out or sys.stdout
    lock = threading.Lock()

    reported: set[str] = set()

    def on_update(update: Any) -> None:
        if args.json:
            text = json.dumps(update.to_dict(), default=str)
        elif update.result is not None and update.result.fired and update.configuration_name in reported:
            # The first finding of a rule is shown in full; later ones take one line each.
            result = update.result
            also = "also advises" if result.advice else "also"
            text = f"trainguard rules: {update.configuration_name}: {also} at step {result.step}: {result.message}"
        else:
            text = format_update(update)
            if update.result is not None and update.result.fired:
                reported.add(update.configuration_name)
        with lock:
            print(text, file=out, flush=True)

    require_local_path(args.path)  # a typo must not wait, nor create <typo>/rule-output/
    specs = _specs_from_args(args)
    if not args.end_on_stdin_eof:  # trainguard run starts the rules before training writes
        _say_when_waiting(args.path, args.wait_timeout)
    stop_event = threading.Event()
    training_done = threading.Event()
    runner = RuleRunner(
        args.path,
        specs,
        progress_file=args.progress,
        output_dir=args.output_dir,
        start_step=args.start_step,
        end_step=args.end_step,
        endpoint_url=args.endpoint_url,
        poll_interval=args.poll_interval,
        on_update=on_update,
        stop_event=stop_event,
        training_done=training_done,
        wait_timeout=args.wait_timeout,
    )
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop_event.set())
    if args.end_on_stdin_eof:
        # trainguard run keeps our stdin open while training runs: EOF means the training
        # process is gone (finished, crashed or stopped), with or without an end marker.
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read makes interpreter
        # shutdown abort ("could not acquire lock for stdin") when the runner ends first.
        def watch_stdin() -> None:
            try:
                while os.read(0, 4096):
                    pass
            except OSError:
                pass
            training_done.set()

        threading.Thread(target=watch_stdin, daemon=True, name="trainguard-stdin-eof").start()
    final = runner.run()
    diagnosis = runner.diagnosis() if runner.progress else None
    damage = _run_damage(runner.trial)
    with lock:
        if args.json:
            if diagnosis is not None:
                print(json.dumps({"diagnosis": diagnosis}, default=str), file=out, flush=True)
        else:
            print(_final_table(final, diagnosis, runner.progress), file=out, flush=True)
        for line in damage:
            print(line, file=sys.stderr if args.json else out, flush=True)
    if damage:
        return EXIT_ERROR  # verdicts on data that cannot be trusted: never "all fine"
    named = None if args.specs_json else args.named_rules  # trainguard run: its own exit status
    return exit_code(final, allow_not_evaluated=args.allow_not_evaluated, named=named)


def _say_when_waiting(path: str, timeout: float) -> None:
    """One line on stderr when the run has not written its first step yet (the runner then
    waits for it, up to ``timeout``), so a wait is never silent."""
    from trainguard.format.layout import COLLECTIONS_PREFIX
    from trainguard.storage import open_store

    try:
        appeared = bool(open_store(path).list(COLLECTIONS_PREFIX))
    except (TrainguardError, OSError, ValueError):
        return  # opening the run says what is wrong
    if not appeared:
        print(
            f"trainguard rules: waiting for the first step in {path} (up to {timeout:.0f} s, --wait-timeout; "
            "Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )


def _run_damage(trial: Any) -> list[str]:
    """One line per damaged file of the run the rules read (``Trial.damage()``), or []."""
    if trial is None:
        return []
    try:
        damage = trial.damage()
    except TrainguardError as error:
        return [f"trainguard rules: damaged: the run could not be checked for damage: {error}"]
    lines = []
    for item in damage:
        where = "" if item.step is None else f"step {item.step}" + (f" of {item.worker}" if item.worker else "") + ": "
        lines.append(f"trainguard rules: damaged: {where}{trial.path.rstrip('/')}/{item.key}: {item.problem}")
    return lines


def _final_table(
    final: dict[str, Any], diagnosis: dict[str, Any] | None = None, progress: dict[str, Any] | None = None
) -> str:
    """One line per rule: an issue is shown as its first finding (step, worker, message, fix),
    not SageMaker's generic StatusDetails; rules that do not apply to the run (by its design:
    ``StatusUpdate.not_applicable``) are counted in one line."""
    from trainguard.rules.diagnosis import render_diagnosis

    lines = ["trainguard rules: final status"]
    inapplicable = [name for name, update in final.items() if _not_applicable(update)]
    if diagnosis is not None:
        # the rules that do not apply are the one line below, not "not evaluated" lines here
        kept = [i for i in diagnosis.get("not_evaluated") or () if i.get("configuration_name") not in inapplicable]
        lines.extend(render_diagnosis({**diagnosis, "not_evaluated": kept}))
    shown = {name: update for name, update in final.items() if name not in inapplicable}
    width = max((len(name) for name in shown), default=0)
    for name, update in shown.items():
        status = status_label(update.status, update.status_details)
        details = (update.status_details or "").strip().replace("\n", " ")
        if status == "NotEvaluated":
            details = details[len(NOT_EVALUATED_PREFIX) :].strip()
        finding = _first_issue(progress.get(name) if progress else None) if status == "IssuesFound" else None
        if finding is not None:
            where = f" on {finding['worker']}" if finding.get("worker") else ""
            details = f"step {finding.get('step')}{where}: {finding.get('message')}"
        lines.append(f"  {name:<{width}}  {status:<13} {details}".rstrip())
        if finding is not None and finding.get("fix_hint"):
            lines.append(f"  {'':<{width}}  {'':<13} fix: {finding['fix_hint']}")
    if inapplicable:
        rules = "rule" if len(inapplicable) == 1 else "rules"
        lines.append(f"  {len(inapplicable)} {rules} not applicable to this run: {', '.join(inapplicable)}")
    return "\n".join(lines)


def _not_applicable(update: Any) -> bool:
    return bool(getattr(update, "not_applicable", False)) and is_not_evaluated(update.status, update.status_details)


def _first_issue(state: Any) -> dict[str, Any] | None:
    """The earliest finding of a rule's progress that is an issue (fired, not advice)."""
    issues = [f for f in getattr(state, "findings", None) or [] if f.get("fired") and not f.get("advice")]
    return min(issues, key=lambda f: int(f.get("step", 0))) if issues else None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rules", help="run, list and describe rules")
    verbs = parser.add_subparsers(dest="rules_verb", required=True)
    run = verbs.add_parser("run", help="evaluate rules on a run, following it while it trains")
    add_run_arguments(run)
    run.set_defaults(func=run_rules)
    listing = verbs.add_parser("list", help="every available rule with its parameters")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=list_rules)
    describe = verbs.add_parser("describe", help="a rule's condition, collections and parameters")
    describe.add_argument("name")
    describe.set_defaults(func=describe_rule)


def module_main(argv: list[str] | None = None) -> int:
    """``python -m trainguard.rules``: ``trainguard rules run`` as its own process."""
    parser = argparse.ArgumentParser(prog="python -m trainguard.rules", description="Evaluate rules on a run.")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_rules(args)
    except TrainguardError as error:
        print(f"trainguard: error: {error}", file=sys.stderr)
        return EXIT_ERROR
