"""``trainguard run``'s training process: started in its own process group with the rules beside
it when asked, signals forwarded, its exit recorded, a warning when it outlives its capture, and
the exit status ``trainguard run`` returns."""

from __future__ import annotations

import argparse
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

from trainguard.errors import ConfigError
from trainguard.launch.options import (
    child_environment,
    configure_capture,
    default_out_dir,
    rule_specs,
    teardown_warning_seconds,
    validate_before_start,
)

__all__ = ["EXIT_STOPPED_BY_RULE", "run_command"]

EXIT_STOPPED_BY_RULE = 3
TEARDOWN_CHECK_INTERVAL = 10.0  # how often the end marker is looked for (s)


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("nothing to run: trainguard run [options] -- python train.py ...")
    if args.stop_grace < 0:
        raise ConfigError(f"--stop-grace {args.stop_grace} must be zero or more seconds")
    out_dir = args.out or default_out_dir()
    environment = child_environment(args, out_dir)
    specs = rule_specs(args)
    configure_capture(args, specs, environment, out_dir)
    from trainguard.format.layout import CAPTURE_STATUS_DIR_VARIABLE

    # A private directory where the hook keeps its capture_stopped record when the run refuses it
    # (a read-only file system): training, the rule runner and the summary (this process) read it.
    status_dir = tempfile.mkdtemp(prefix="trainguard-capture-status-")
    previous = os.environ.get(CAPTURE_STATUS_DIR_VARIABLE)
    environment[CAPTURE_STATUS_DIR_VARIABLE] = os.environ[CAPTURE_STATUS_DIR_VARIABLE] = status_dir
    try:
        validate_before_start(environment, out_dir)
        return _supervise(args, command, environment, out_dir, specs)
    finally:
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
    returncode = _wait_for_training(child, out_dir, teardown_warning_seconds(environment))
    _record_exit(out_dir, returncode)
    rules = None
    if watch is not None:
        latest = watch.training_finished()
        from trainguard.summary import rule_results_from_updates

        rules = rule_results_from_updates(latest, watch.findings)
    from trainguard.summary import print_summary

    print_summary(out_dir, rules=rules, stopped=watch.stop_record if watch is not None else None, returncode=returncode)
    if watch is not None and watch.stopped:
        return EXIT_STOPPED_BY_RULE
    if returncode == 0 and rules and not args.allow_not_evaluated:
        from trainguard.commands.rules import EXIT_NOT_EVALUATED, is_not_evaluated

        # "Could not check" must not read as "checked, all fine": the summary says which rule and
        # why, and a rule the user named fails the exit status. Rules of the implicit default set
        # do not: most models have no tanh for SaturatedActivation and many loops no validation
        # for Overfit, and a healthy run must exit 0.
        named: set[str] = getattr(args, "named_rules", set())
        if any(
            is_not_evaluated(rule.get("status"), rule.get("status_details")) and rule.get("configuration_name") in named
            for rule in rules
        ):
            return EXIT_NOT_EVALUATED
    # A child killed by a signal: the shell convention 128 + signal, not a wrapped negative number.
    return 128 - returncode if returncode < 0 else returncode


def _record_exit(out_dir: str, returncode: int | None) -> None:
    """``trainguard-exit.json``: how training ended, so a dashboard can tell a failed run from one
    that completed (the hook's end marker is written either way). ``None`` when the command
    starts: an uploader following the directory then waits for the final record."""
    from trainguard.format.layout import RUN_EXIT_RECORD
    from trainguard.rules.progress import write_json_atomic
    from trainguard.storage import is_remote

    if not is_remote(out_dir):
        now = time.time()
        record = (
            {"returncode": None, "started_at": now}
            if returncode is None
            else {"returncode": returncode, "ended_at": now}
        )
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

    argv = child.args
    shown = " ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv)
    processes = _process_group_members(child.pid) or [(child.pid, shown)]
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
