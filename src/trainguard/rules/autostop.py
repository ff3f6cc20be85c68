"""Rules beside a training process on one machine, and stopping it when a rule fires.

``trainguard run --rules ... --stop-on-issue`` uses :class:`RuleWatch`:

* the rules run in their own process (``python -m trainguard.rules``), so a slow or
  crashing rule never slows or crashes training, and training never starves the rules of the
  GIL; it follows the capture as it is written and prints one JSON StatusUpdate per line;
* the watch reads those lines on a thread; when a rule whose actions say ``stoptraining`` fires
  with a *certain* finding (``StepResult.certain``: non-finite values, a condition confirmed over
  its persistence window), it stops the training process group (uncertain findings are only
  reported: a debugger that kills healthy runs gets uninstalled; advice never stops anything):
  SIGTERM, then SIGKILL after ``grace`` seconds, so the script's own children (data-loader
  workers, ``torch.multiprocessing``) go too;
* the stop names the run's diagnosis at that moment (:mod:`trainguard.rules.diagnosis`): the
  primary finding, the cause, whose fix comes first in ``trainguard-stop.json``, and the certain
  finding that triggered the stop apart from it (a learning rate far too high is stopped when the
  sigmoids it saturated are certain, but the fix is the learning rate, not "use ReLU");
* when training ends, however it ends, the runner's stdin is closed: the runner evaluates what
  is left, runs each rule's ``finish()`` and exits with the final statuses.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainguard.priority import nice_from_environment
from trainguard.rules.actions import spec_actions, stops_training
from trainguard.rules.runner import StatusUpdate
from trainguard.rules.spec import RuleSpec

__all__ = ["RuleWatch", "StopRecord", "stop_process_group", "stop_record"]

logger = logging.getLogger("trainguard.rules")
STOP_RECORD_FILE = "trainguard-stop.json"


class StopRecord(dict):  # a dict so it serialises as is
    """Why and when the watch stopped training."""


def stop_process_group(process: subprocess.Popen, grace: float) -> tuple[float, float]:
    """SIGTERM the process's group, SIGKILL it after ``grace`` s; (signalled_at, gone_at) epoch s.

    The caller's thread, or another, may be blocked in ``process.wait()``: this only signals and
    watches the group, so either way the process is reaped exactly once.
    """
    signalled = time.time()
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return signalled, signalled
    deadline = time.monotonic() + max(0.0, grace)
    while time.monotonic() < deadline:
        if not _group_alive(process):
            return signalled, time.time()
        time.sleep(0.02)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while _group_alive(process) and time.monotonic() < deadline + 5:
        time.sleep(0.02)
    return signalled, time.time()


def _group_alive(process: subprocess.Popen) -> bool:
    if process.poll() is None:
        return True
    try:
        os.killpg(process.pid, 0)  # grandchildren left in the group
    except (ProcessLookupError, PermissionError):
        return False
    return True


class RuleWatch:
    """Runs the rule runner process for one local capture and stops training on a finding.

    Args:
        out_dir: the capture (the hook's out_dir).
        specs: rule configurations; those with a ``stoptraining`` action stop training.
        grace: seconds between SIGTERM and SIGKILL when stopping training.
        poll_interval: the runner's poll interval (small: it bounds detection latency).
        endpoint_url: S3 endpoint when ``out_dir`` is ``s3://``.
        echo: where live findings are printed (None: silent).
        nice: the runner's nice value; it runs as batch work, behind training and ahead of the
            writer process (nice 10). Default: ``TRAINGUARD_RULES_NICE`` or 5.
    """

    NICE = 5

    def __init__(
        self,
        out_dir: str,
        specs: Sequence[RuleSpec],
        *,
        grace: float = 10.0,
        poll_interval: float = 0.1,
        endpoint_url: str | None = None,
        echo: Callable[[str], None] | None = None,
        nice: int | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.nice = nice if nice is not None else nice_from_environment("TRAINGUARD_RULES_NICE", self.NICE)
        self.specs = list(specs)
        self.grace = grace
        self.poll_interval = poll_interval
        self.endpoint_url = endpoint_url
        self.echo = echo
        self.stopping_configs = {spec.name for spec in self.specs if stops_training(spec_actions(spec))}
        self.latest: dict[str, StatusUpdate] = {}
        self.findings: list[StatusUpdate] = []
        self.stop_record: StopRecord | None = None
        self.diagnosis: dict[str, Any] | None = None
        self._training: subprocess.Popen | None = None
        self._runner: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._stopper: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the runner process (before training: it waits for the capture to appear)."""
        document = [
            {"rule": s.rule, "parameters": dict(s.parameters), "configuration_name": s.name, "actions": list(s.actions)}
            for s in self.specs
        ]
        command = [
            sys.executable, "-m", "trainguard.rules", self.out_dir,
            "--specs-json", json.dumps(document), "--json", "--end-on-stdin-eof",
            "--poll-interval", str(self.poll_interval), "--wait-timeout", str(7 * 24 * 3600),
            "--background-nice", str(self.nice),
        ]  # fmt: skip
        if self.endpoint_url:
            command += ["--endpoint-url", self.endpoint_url]
        # Its own process group: a Ctrl-C at the terminal goes to trainguard run, which passes it
        # to training; the runner then sees training end (stdin EOF) and finishes its rules.
        self._runner = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_runner_environment(), text=True, bufsize=1,
            process_group=0,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read_updates, daemon=True, name="trainguard-rule-updates")
        self._reader.start()

    def attach(self, training: subprocess.Popen) -> None:
        """The training process to stop (started with ``process_group=0``)."""
        self._training = training

    def training_finished(self, timeout: float = 120.0) -> dict[str, StatusUpdate]:
        """Tell the runner training is over and wait for its final statuses (bounded)."""
        if self._stopper is not None:
            self._stopper.join()
        runner = self._runner
        if runner is None:
            return {}
        try:
            if runner.stdin is not None:
                runner.stdin.close()
        except OSError:
            pass
        try:
            runner.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("trainguard: the rule runner did not finish within %.0f s; stopping it", timeout)
            runner.terminate()
            try:
                runner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                runner.kill()
                runner.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        return dict(self.latest)

    @property
    def stopped(self) -> bool:
        return self.stop_record is not None

    # -- reading the runner --------------------------------------------------------------------
    def _read_updates(self) -> None:
        assert self._runner is not None and self._runner.stdout is not None
        for line in self._runner.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                document = json.loads(line)
                if isinstance(document, dict) and set(document) == {"diagnosis"}:
                    self.diagnosis = document["diagnosis"]  # the runner's last line
                    continue
                update = StatusUpdate.from_dict(document)
            except (ValueError, KeyError, TypeError) as error:
                logger.warning("trainguard: unreadable rule update %r: %s", line[:200], error)
                continue
            with self._lock:
                self.latest[update.configuration_name] = update
                fired = update.result is not None and update.result.fired
                if fired:
                    self.findings.append(update)
            if fired:
                self._on_finding(update)

    def _on_finding(self, update: StatusUpdate) -> None:
        result = update.result
        assert result is not None
        # the worker is named: on a distributed run the finding is about one rank's tensors
        where = f" on {result.worker}" if result.worker else ""
        if result.advice:  # a property of the data or the initialisation: reported, never a stop
            if self.echo is not None:
                name = update.configuration_name
                self.echo(f"trainguard: rule {name} advises at step {result.step}{where}: {result.message}")
            return
        if self.echo is not None:
            self.echo(
                f"trainguard: rule {update.configuration_name} found an issue at step {result.step}{where}: "
                f"{result.message}"
            )
        if update.configuration_name in self.stopping_configs and not result.certain:
            if self.echo is not None:
                self.echo(f"trainguard: not stopping training: {update.configuration_name}'s finding is not certain")
            return
        if update.configuration_name in self.stopping_configs and self._training is not None:
            with self._lock:
                if self._stopper is not None:
                    return
                self._stopper = threading.Thread(target=self._stop_training, args=(update,), name="trainguard-stop")
                self._stopper.start()

    def _stop_training(self, update: StatusUpdate) -> None:
        assert self._training is not None and update.result is not None
        detected = time.time()
        trigger = _trigger(update)
        primary = self._primary(update) or trigger
        if self.echo is not None:
            # the diagnosis is named only when it is another finding than the one that triggered
            same = (primary.get("rule"), primary.get("step")) == (trigger["rule"], trigger["step"])
            cause = "" if same else f"; diagnosis: {primary['rule']} ({primary['fix_hint']})"
            self.echo(
                f"trainguard: stopping training: {update.configuration_name} fired at step {update.result.step}{cause} "
                f"(SIGTERM, SIGKILL after {self.grace:g} s)"
            )
        signalled, gone = stop_process_group(self._training, self.grace)
        self.stop_record = stop_record(primary, trigger, update.timestamp, detected, signalled, gone)
        _write_stop_record(self.out_dir, self.stop_record)

    def _primary(self, update: StatusUpdate) -> dict[str, Any] | None:
        """The diagnosis' primary finding over what the runner reported so far (the trigger
        included), or None when it cannot be told (a broken update: the trigger stands)."""
        from trainguard.rules.diagnosis import diagnose
        from trainguard.summary import rule_results_from_updates

        try:
            with self._lock:
                results = rule_results_from_updates(dict(self.latest), list(self.findings))
            primary = diagnose(results)["primary"]
        except Exception:  # noqa: BLE001 - the stop must happen whatever the diagnosis does
            logger.warning("trainguard: cannot diagnose the run at the stop; the stop names its trigger", exc_info=True)
            return None
        if not primary:
            return None
        found = dict(primary[0])
        names = {u.rule: u.configuration_name for u in self.findings}  # a rule's configuration, for the record
        found["configuration_name"] = names.get(str(found.get("rule")), found.get("rule"))
        return found


def _trigger(update: StatusUpdate) -> dict[str, Any]:
    result = update.result
    assert result is not None
    return {
        "configuration_name": update.configuration_name, "rule": update.rule, "step": result.step,
        "message": result.message, "fix_hint": result.fix_hint, "worker": result.worker, "certain": result.certain,
    }  # fmt: skip


def stop_record(
    primary: dict[str, Any], trigger: dict[str, Any], reported: float, detected: float, signalled: float, gone: float
) -> StopRecord:
    """The ``trainguard-stop.json`` record: the stop names the diagnosis' primary finding (its
    rule, message and fix), not the finding that happened to trigger it, which is kept apart.

    ``configuration_name``, ``rule``, ``message``, ``fix_hint``, ``worker``: the primary;
    ``primary_step``: its step; ``step``: the step of the certain finding the stop acted on;
    ``certain``: that finding's certainty (a stop acts only on certain findings);
    ``primary_certain``: the primary's; ``triggered_by``: the triggering finding in full.
    """
    return StopRecord(
        configuration_name=primary.get("configuration_name") or primary.get("rule"),
        rule=primary.get("rule"),
        step=trigger["step"],
        primary_step=primary.get("step"),
        message=primary.get("message"),
        fix_hint=primary.get("fix_hint"),
        worker=primary.get("worker"),
        certain=trigger["certain"],
        primary_certain=bool(primary.get("certain")),
        triggered_by=dict(trigger),
        finding_reported_at=reported,
        detected_at=detected,
        signalled_at=signalled,
        stopped_at=gone,
    )


def _runner_environment() -> dict[str, str]:
    """The runner must not capture itself: no zero-code variables; trainguard importable."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_ZERO_CODE")}
    environment.pop("TRAINGUARD_CONFIG", None)
    package_root = str(Path(__file__).resolve().parents[2])
    existing = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, existing) if p)
    return environment


def _write_stop_record(out_dir: str, record: dict[str, Any]) -> None:
    from trainguard.rules.progress import write_json_atomic
    from trainguard.storage import is_remote

    if is_remote(out_dir):
        return
    try:
        write_json_atomic(Path(out_dir) / STOP_RECORD_FILE, record)
    except OSError as error:
        logger.warning("trainguard: cannot write %s: %s", STOP_RECORD_FILE, error)
