"""The ``trainguard`` command.

trainguard run [--out DIR] [--config hook.json] [--save-interval N | --overhead-budget F]
               [--rules [A,B:key=v,...]] [--stop-on-issue] [--stop-grace S] [--allow-not-evaluated]
               [--profile] [--profile-interval-ms MS] -- python train.py ...
trainguard summary RUN [--json]
trainguard tensorboard RUN OUT_DIR

Every verb that reads or writes a run takes --endpoint-url, --profile (--aws-profile; only that on
``run``, whose --profile records system metrics) and --region for s3:// runs
(:mod:`trainguard.storage.options`).

``trainguard run`` exits with the training command's status, 3 when a rule stopped training (only
certain findings stop it), and 4 when training succeeded but a rule named in ``--rules`` could not
evaluate the run (its data is missing) unless ``--allow-not-evaluated``. Rules of the implicit
default set that could not evaluate are reported as such but leave the status alone.

A training command still running TRAINGUARD_TEARDOWN_WARNING_SECONDS (default 300) after its
capture's end-of-training marker gets one warning on stderr naming its processes (stuck in
teardown?); nothing is stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError, TrainguardError

__all__ = ["main"]

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
EXIT_STOPPED_BY_RULE = 3
# A training command still running this long after its capture's end marker gets one warning
# naming its processes (nothing is stopped); TRAINGUARD_TEARDOWN_WARNING_SECONDS overrides.
TEARDOWN_WARNING_VARIABLE = "TRAINGUARD_TEARDOWN_WARNING_SECONDS"
DEFAULT_TEARDOWN_WARNING_SECONDS = 300.0
TEARDOWN_CHECK_INTERVAL = 10.0  # how often the end marker is looked for (s)
# Under --rules/--stop-on-issue the overhead budget spaces weights, gradients and outputs at most
# this many steps apart (500 otherwise). Measured (fast MLP, fault at step 3,000 of 6,000, default
# rules): learning rate set to 0 found by WeightUpdateRatio at step 3,070 at interval 10, 3,670 at
# 100, never at 500; learning rate set to 1e4 found at 3,010 / 3,070 / 3,070.
LIVE_RULES_MAX_INTERVAL = 100


def _default_out_dir() -> str:
    return os.path.join("trainguard-runs", time.strftime("%Y%m%d-%H%M%S"))


def _child_environment(args: argparse.Namespace, out_dir: str) -> dict[str, str]:
    environment = dict(os.environ)
    # The bootstrap dir must come first: it holds the sitecustomize that arms the hook. The
    # package's own location is added so the child finds trainguard whatever its sys.path.
    package_root = str(Path(__file__).resolve().parents[1])
    existing = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), package_root, existing) if p)
    environment["TRAINGUARD_ZERO_CODE"] = "1"
    environment["TRAINGUARD_OUT_DIR"] = out_dir
    if args.config:
        environment["TRAINGUARD_CONFIG"] = str(Path(args.config).resolve())
    if args.save_interval is not None:
        if args.save_interval < 1:
            raise ConfigError(f"--save-interval {args.save_interval} must be a positive number of steps")
        environment["TRAINGUARD_SAVE_INTERVAL"] = str(args.save_interval)
    environment["TRAINGUARD_OVERHEAD_BUDGET"] = str(_overhead_budget(args))
    if _judged_live(args):
        environment["TRAINGUARD_OVERHEAD_MAX_INTERVAL"] = str(LIVE_RULES_MAX_INTERVAL)
    if args.profile:
        environment["TRAINGUARD_PROFILER"] = "1"
    if args.profile_interval_ms is not None:
        if args.profile_interval_ms <= 0:
            raise ConfigError(
                f"--profile-interval-ms {args.profile_interval_ms} must be a positive number of milliseconds"
            )
        environment["TRAINGUARD_PROFILER"] = "1"
        environment["TRAINGUARD_PROFILER_INTERVAL_MS"] = str(args.profile_interval_ms)
    return environment


def _overhead_budget(args: argparse.Namespace) -> float:
    """The capture's share of training time: given, or the default unless the user fixed the
    schedule (--save-interval, --config); 0 keeps the schedule as configured."""
    from trainguard.zero_code import DEFAULT_OVERHEAD_BUDGET

    if args.overhead_budget is not None:
        if not 0 <= args.overhead_budget < 1:
            raise ConfigError(f"--overhead-budget {args.overhead_budget} must be a fraction from 0 to below 1")
        return args.overhead_budget
    fixed = args.save_interval is not None or args.config
    return 0.0 if fixed else DEFAULT_OVERHEAD_BUDGET


def _judged_live(args: argparse.Namespace) -> bool:
    return args.rules is not None or args.stop_on_issue


def _rule_specs(args: argparse.Namespace) -> list[Any]:
    """The rules of ``--rules`` (``default`` = the default set, with the profiler rules under
    ``--profile``); with ``--stop-on-issue`` each gets the stoptraining action.

    ``NAME:name=CONFIG,...`` names a configuration, so that one rule can run twice with different
    parameters (``StepOutlier:name=fast,stddev=3 --rules StepOutlier:name=slow,stddev=6``); two
    configurations given explicitly under one name are an error. A configuration of the default
    set is replaced by a later one of its name (``--rules default --rules ExplodingTensor:...``).
    """
    args.named_rules = set()
    if not _judged_live(args):
        return []  # before the imports: rule machinery is not loaded for a run without rules
    from trainguard.commands.rules import parse_rule_list
    from trainguard.rules.defaults import default_rule_specs

    values = list(args.rules or [])
    if args.stop_on_issue and not values:
        values = ["default"]
    specs: dict[str, Any] = {}
    named: set[str] = set()
    for value in values:
        for spec in parse_rule_list(value):
            from_default_set = spec.rule.lower() == "default" and not spec.parameters
            if from_default_set:
                chosen = default_rule_specs()
                if args.profile or args.profile_interval_ms is not None:
                    from trainguard.rules.profiler_defaults import default_profiler_rule_specs

                    chosen += default_profiler_rule_specs()
            else:
                chosen = [_configuration(spec)]
            for one in chosen:
                if not from_default_set and one.name in named:
                    raise ConfigError(
                        f"--rules: two configurations are named {one.name!r}; give each its own name "
                        f"({one.rule}:name=NAME,...)"
                    )
                specs.pop(one.name, None)
                specs[one.name] = one
                if not from_default_set:
                    named.add(one.name)
    args.named_rules = named
    if args.stop_on_issue:
        stop = ({"name": "stoptraining"},)
        specs = {name: dataclasses.replace(spec, actions=tuple(spec.actions) + stop) for name, spec in specs.items()}
    return list(specs.values())


def _configuration(spec: Any) -> Any:
    """``name=`` of ``--rules NAME:name=CONFIG,...`` is the configuration's name (SageMaker's
    RuleConfigurationName), not a rule parameter."""
    parameters = dict(spec.parameters)
    name = parameters.pop("name", None)
    if name is None:
        return spec
    if not str(name).strip():
        raise ConfigError(f"--rules {spec.rule}:name= needs a configuration name")
    return dataclasses.replace(spec, parameters=parameters, configuration_name=str(name).strip())


def _configure_capture_for_rules(args: argparse.Namespace, specs: list[Any], environment: dict[str, str]) -> str | None:
    """Write the hook config the rules need (their collections on top of the user's); returns
    the temporary directory holding it.

    Without rules the capture is for judging later (``trainguard rules run RUN``): it saves what
    the default rules read, unless ``--config`` says exactly what to save (then nothing is added).
    """
    from trainguard.rules.defaults import DEFAULT_RULE_COLLECTIONS, hook_config_for_rules

    if specs:
        from trainguard.rules.defaults import rule_collections
        from trainguard.rules.runner import validate_specs

        classes = validate_specs(specs).values()
        collections = rule_collections(classes)
        if any(getattr(cls, "kind", "debugger") == "profiler" for cls in classes):
            environment.setdefault("TRAINGUARD_PROFILER", "1")  # a profiler rule named: its data is recorded
    elif args.config:
        return None
    else:
        collections = list(DEFAULT_RULE_COLLECTIONS)  # no rule imported: numpy stays unloaded before the start
    document = hook_config_for_rules(collections, base_config=args.config, save_interval=args.save_interval)
    directory = tempfile.mkdtemp(prefix="trainguard-run-")
    path = os.path.join(directory, "debughookconfig.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=1)
    environment["TRAINGUARD_CONFIG"] = path
    return directory


def _validate(environment: dict[str, str], out_dir: str) -> None:
    """Fail before training on a bad config or an unusable out_dir."""
    from trainguard.format.layout import END_OF_TRAINING
    from trainguard.hooks.run_end import peer_wait_seconds
    from trainguard.storage import LocalStore, open_store
    from trainguard.zero_code import zero_code_hook_kwargs

    zero_code_hook_kwargs(environment, drop_unknown_collections=False)
    peer_wait_seconds(environment)
    _teardown_warning_seconds(environment)
    store = open_store(out_dir)
    if store.exists(END_OF_TRAINING):
        raise ConfigError(f"--out {out_dir} already holds a finished run: choose a new directory")
    if isinstance(store, LocalStore):
        try:
            store.root.mkdir(parents=True, exist_ok=True)
            probe = store.root / ".trainguard-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise ConfigError(f"--out {out_dir} is not writable: {error.strerror or error}") from None


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("nothing to run: trainguard run [options] -- python train.py ...")
    if args.stop_grace < 0:
        raise ConfigError(f"--stop-grace {args.stop_grace} must be zero or more seconds")
    out_dir = args.out or _default_out_dir()
    environment = _child_environment(args, out_dir)
    specs = _rule_specs(args)
    config_dir = _configure_capture_for_rules(args, specs, environment)
    from trainguard.format.layout import CAPTURE_STATUS_DIR_VARIABLE

    # A private directory where the hook keeps its capture_stopped record when the run refuses it
    # (a read-only file system): training, the rule runner and the summary (this process) read it.
    status_dir = tempfile.mkdtemp(prefix="trainguard-capture-status-")
    previous = os.environ.get(CAPTURE_STATUS_DIR_VARIABLE)
    environment[CAPTURE_STATUS_DIR_VARIABLE] = os.environ[CAPTURE_STATUS_DIR_VARIABLE] = status_dir
    try:
        _validate(environment, out_dir)
        return _supervise(args, command, environment, out_dir, specs)
    finally:
        if config_dir:
            shutil.rmtree(config_dir, ignore_errors=True)
        shutil.rmtree(status_dir, ignore_errors=True)
        if previous is None:
            os.environ.pop(CAPTURE_STATUS_DIR_VARIABLE, None)
        else:
            os.environ[CAPTURE_STATUS_DIR_VARIABLE] = previous


def _supervise(
    args: argparse.Namespace, command: list[str], environment: dict[str, str], out_dir: str, specs: list[Any]
) -> int:
    """Run training in its own process group, with the rules beside it when asked."""
    print(f"trainguard: capturing to {out_dir}", file=sys.stderr, flush=True)
    watch = None
    if specs:
        from trainguard.rules.autostop import RuleWatch

        names = ", ".join(spec.name for spec in specs)
        action = "; training stops when one fires" if args.stop_on_issue else ""
        print(f"trainguard: rules {names}{action}", file=sys.stderr, flush=True)
        watch = RuleWatch(
            out_dir, specs, grace=args.stop_grace, echo=lambda line: print(line, file=sys.stderr, flush=True)
        )
        watch.start()
    _record_exit(out_dir, None)
    # Own process group: stopping it reaches the script's children (data-loader workers) too.
    try:
        child = subprocess.Popen(command, env=environment, process_group=0)
    except OSError as error:
        # The shell's statuses: 127 not found, 126 found but not runnable.
        returncode = 127 if isinstance(error, FileNotFoundError) else 126
        _record_exit(out_dir, returncode)
        if watch is not None:
            watch.training_finished(timeout=30)
        print(f"trainguard: cannot run {command[0]!r}: {error.strerror or error}", file=sys.stderr, flush=True)
        return returncode
    if watch is not None:
        watch.attach(child)
    # The summary printed when training ends reads the run with the trial (numpy, the codecs):
    # loaded now, while the script starts, instead of delaying the command's return by their
    # import time once training is over.
    try:
        import trainguard.summary  # noqa: F401
        import trainguard.trial  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - training runs now: the summary reports it at the end
        pass

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    returncode = _wait_for_training(child, out_dir, _teardown_warning_seconds(environment))
    _record_exit(out_dir, returncode)
    rules = None
    if watch is not None:
        latest = watch.training_finished()
        from trainguard.summary import rule_results_from_updates

        rules = rule_results_from_updates(latest, watch.findings)
    _print_summary(
        out_dir, rules=rules, stopped=watch.stop_record if watch is not None else None, returncode=returncode
    )
    if watch is not None and watch.stopped:
        return EXIT_STOPPED_BY_RULE
    if returncode == 0 and rules and not args.allow_not_evaluated:
        from trainguard.commands.rules import EXIT_NOT_EVALUATED, is_not_evaluated

        # "Could not check" must not read as "checked, all fine": the summary says which rule and
        # why, and a rule the user named fails the exit status. Rules of the implicit default set
        # do not: most models have no tanh for SaturatedActivation and many loops no validation
        # for Overfit, and a healthy run must exit 0.
        named = getattr(args, "named_rules", set())
        if any(
            is_not_evaluated(rule.get("status"), rule.get("status_details"))
            and rule.get("configuration_name") in named
            for rule in rules
        ):
            return EXIT_NOT_EVALUATED
    # A child killed by a signal: the shell convention 128 + signal, not a wrapped negative number.
    return 128 - returncode if returncode < 0 else returncode


def _teardown_warning_seconds(environment: dict[str, str]) -> float:
    raw = environment.get(TEARDOWN_WARNING_VARIABLE)
    if raw is None or raw == "":
        return DEFAULT_TEARDOWN_WARNING_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{TEARDOWN_WARNING_VARIABLE}={raw!r} must be a positive number of seconds")
    return seconds


def _record_exit(out_dir: str, returncode: int | None) -> None:
    """``trainguard-exit.json``: how training ended, so a dashboard can tell a failed run from one
    that completed (the hook's end marker is written either way). ``None`` when the command
    starts: an uploader following the directory then waits for the final record."""
    from trainguard.format.layout import RUN_EXIT_RECORD
    from trainguard.rules.progress import write_json_atomic
    from trainguard.storage import is_remote

    if not is_remote(out_dir):
        now = time.time()
        record = {"returncode": None, "started_at": now} if returncode is None else {
            "returncode": returncode, "ended_at": now
        }
        try:
            write_json_atomic(Path(out_dir) / RUN_EXIT_RECORD, record)
        except OSError:
            pass  # the run's directory is gone or read-only: the dashboard then shows "completed"


def _wait_for_training(child: subprocess.Popen, out_dir: str, warn_after: float) -> int:
    """``child.wait()``, with one warning when the command outlives its capture's end by
    ``warn_after`` seconds.

    The end-of-training marker is written by the hook's close at interpreter exit (worker_0's,
    in a distributed run): processes still there long after it are usually stuck in teardown
    (e.g. PyTorch joining its gloo threads while holding the GIL). They might also still be
    doing legitimate work (an upload, another rank finishing), so they are only named, never
    signalled: Ctrl-C or SIGTERM to trainguard still stops the whole group. A hang before the
    hook's close (no marker yet) looks like training and gets no warning.
    """
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch_teardown, args=(child, out_dir, warn_after, done), name="trainguard-teardown", daemon=True
    )
    watcher.start()
    try:
        return child.wait()
    finally:
        done.set()


def _watch_teardown(child: subprocess.Popen, out_dir: str, warn_after: float, done: threading.Event) -> None:
    from trainguard.format.layout import END_OF_TRAINING
    from trainguard.storage import open_store

    try:
        store = open_store(out_dir)
        # an s3:// run is asked once per interval until the marker exists: a HEAD request
        while not done.wait(min(TEARDOWN_CHECK_INTERVAL, warn_after)):
            if store.exists(END_OF_TRAINING):
                break
        else:
            return
        if not done.wait(warn_after):
            _warn_still_running(child, warn_after)
    except Exception:  # noqa: BLE001 - a diagnostic only: never disturb the run
        return


def _warn_still_running(child: subprocess.Popen, seconds: float) -> None:
    from trainguard.format.layout import END_OF_TRAINING

    processes = _process_group_members(child.pid) or [(child.pid, " ".join(map(str, child.args)))]
    listed = "; ".join(f"pid {pid} ({command[:120]})" for pid, command in processes)
    print(
        f"trainguard: warning: the training command is still running {seconds:.0f} s after its capture "
        f"ended ({END_OF_TRAINING} written at the hook's close). It may be stuck in interpreter or "
        f"framework teardown; see where with: py-spy dump --native --pid <pid>. Still running: {listed}. "
        "trainguard keeps waiting and stops nothing; Ctrl-C or SIGTERM to trainguard stops them all.",
        file=sys.stderr,
        flush=True,
    )


def _process_group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes in process group ``pgid``, from /proc (Linux);
    empty where /proc cannot say."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read().decode(errors="replace")
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        members.append((int(entry), command or stat[stat.index("(") + 1 : stat.rindex(")")]))
    return sorted(members)


def _print_summary(
    path: str,
    as_json: bool = False,
    rules: list[dict[str, Any]] | None = None,
    stopped: dict[str, Any] | None = None,
    returncode: int | None = None,
    strict: bool = False,
) -> None:
    """``strict`` (the summary verb): a run that cannot be read is an error (exit 2); after
    ``trainguard run`` it is one line, since training's own status is the answer then."""
    from trainguard.summary import describe_run, render_rule_results, render_summary
    from trainguard.trial import create_trial

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


def _tensorboard(args: argparse.Namespace) -> int:
    from trainguard.tensorboard import export_run

    def progress(done: int, total: int) -> None:  # a long run's export shows it is moving
        print(f"trainguard: tensorboard: {done}/{total} steps converted", file=sys.stderr, flush=True)

    counts = export_run(args.run, args.out_dir, progress=progress)
    print(f"trainguard: wrote {counts} to {args.out_dir}; view with: tensorboard --logdir {args.out_dir}")
    return 0


def build_parser(all_verbs: bool = True) -> argparse.ArgumentParser:
    """The parser of every verb; ``all_verbs=False`` leaves out the verbs of trainguard.commands
    and plugins (``trainguard run`` starts training sooner without importing them)."""
    from trainguard.storage.options import add_storage_arguments

    parser = argparse.ArgumentParser(prog="trainguard", description="Capture and check tensors of training jobs.")
    commands = parser.add_subparsers(dest="verb", required=True)
    run = commands.add_parser("run", help="run a training command with zero-code capture")
    run.add_argument("--out", help="where to write the run (directory or s3://); default trainguard-runs/<time>")
    run.add_argument("--config", help="hook config: SageMaker DebugHookConfig JSON (debughookconfig.json)")
    run.add_argument("--save-interval", type=int, help="save every N steps (default 10; the config file wins)")
    run.add_argument(
        "--overhead-budget",
        type=float,
        help="share of training time the capture may take (default 0.01 unless --save-interval or --config "
        "fixes the schedule): past its first 20 saves (16 when far over budget), weights, gradients and "
        "outputs are saved on fewer steps (at least every 500; every 100 under --rules/--stop-on-issue) when "
        "saving costs more, then losses and scalars (at least every 100) if they alone cost more; 0: the "
        "schedule as configured",
    )
    run.add_argument(
        "--rules", action="append", nargs="?", const="default", metavar="A,B:key=v",
        help="run rules beside training (no value: the default set; 'trainguard rules list' shows all)",
    )  # fmt: skip
    run.add_argument("--stop-on-issue", action="store_true", help="stop training when a rule fires (implies --rules)")
    run.add_argument(
        "--allow-not-evaluated", action="store_true",
        help="exit with training's status even when a named rule could not evaluate the run (default: 4 then)",
    )  # fmt: skip
    run.add_argument("--stop-grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")
    run.add_argument("--profile", action="store_true", help="also record system and framework metrics")
    run.add_argument("--profile-interval-ms", type=int, help="profiler sampling interval (implies --profile)")
    add_storage_arguments(run, profile_flag=False)  # --profile records system metrics here
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- followed by the training command")
    summary = commands.add_parser("summary", help="summarise a captured run")
    summary.add_argument("run")
    summary.add_argument("--json", action="store_true")
    add_storage_arguments(summary)
    board = commands.add_parser("tensorboard", help="export a run as TensorBoard event files")
    board.add_argument("run")
    board.add_argument("out_dir")
    add_storage_arguments(board)
    if all_verbs:
        _register_command_modules(commands)
    return parser


def _register_command_modules(commands: argparse._SubParsersAction) -> None:
    """Add the verbs defined in trainguard.commands (see its docstring)."""
    import importlib
    import pkgutil

    from trainguard import commands as package

    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if not module_info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module_info.name}").register(commands)
    _register_plugin_commands(commands)


def _register_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """Add verbs other packages declare in the ``trainguard.commands`` entry-point group (``serve``).

    A plugin that fails to load (its extra not installed, a broken install) costs only its verb:
    the rest of the CLI must keep working, so the failure is reported on stderr and skipped.
    """
    from importlib.metadata import entry_points

    for entry_point in sorted(entry_points(group="trainguard.commands"), key=lambda point: point.name):
        try:
            entry_point.load()(commands)
        except Exception as error:  # noqa: BLE001 - one broken plugin must not take the CLI down
            print(f"trainguard: command {entry_point.name!r} unavailable: {error}", file=sys.stderr)


def _dispatch(args: argparse.Namespace) -> int:
    if args.verb == "run":
        return _run(args)
    if args.verb in ("summary", "tensorboard"):
        from trainguard.storage import require_local_path

        require_local_path(args.run)  # a typo is an error at once, not "nothing captured"
    if args.verb == "summary":
        _print_summary(args.run, args.json, strict=True)
        return 0
    if args.verb == "tensorboard":
        return _tensorboard(args)
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # Every moment before `trainguard run` starts the command delays training: the other verbs'
    # modules (the API client, rule commands) and plugin entry points are not loaded for it.
    run_only = bool(words) and words[0] == "run"
    args = build_parser(all_verbs=not run_only).parse_args(argv)
    from trainguard.storage.options import storage_options_from_args

    try:
        # Every store this command opens, and every process it starts, reaches s3:// with the
        # same options (restored afterwards: main() may be called in a longer-lived process).
        with storage_options_from_args(args).exported():
            return _dispatch(args)
    except TrainguardError as error:
        print(f"trainguard: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
