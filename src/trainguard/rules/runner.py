"""The live rule runner: follow a run (finished or still training) and evaluate rules on it.

    from trainguard.rules.runner import RuleRunner, StatusUpdate
    runner = RuleRunner("s3://bucket/job/debug-output", [RuleSpec("VanishingGradient")],
                        endpoint_url="http://minio:9000", on_update=print)
    final = runner.run()        # {configuration name: StatusUpdate}, once training has ended

What it does, in order:

1. waits (up to ``wait_timeout``) for the run to appear (its collections file);
2. on every poll, evaluates each rule on each new *complete* global step within
   ``[start_step, end_step)``, in step order; a poll without a new step calls
   ``rule.check_idle(now)`` instead (profiler rules get ``check_idle`` on every poll, since
   their data is not in steps);
3. when training has ended (end marker, or ``training_done`` set by a caller that knows the
   process is gone) and every step was evaluated, calls ``rule.finish()`` and ends with
   ``NoIssuesFound`` / ``IssuesFound`` / ``Error`` per rule; ``stop_event`` ends it early with
   ``Stopped``.

Tensor rules (``kind == "debugger"``) run once per worker that wrote data: each worker gets its
own rule instance, reading the run through a :class:`~trainguard.trial.worker_view.WorkerTrial`
bound to that worker, and each finding says which worker it is on (``StepResult.worker``). Rules
need not know about workers; a rule class that judges the whole run (it compares workers, or
reads no tensors) sets ``per_worker = False``. Rules with ``check_idle`` (time-based) and
profiler rules run once.

A rule whose results were all "not evaluated" (``Rule.not_evaluated``), or missing tensors, or
that had nothing to evaluate at any step ends with ``Error`` and details
``RuleNotEvaluated: <why>``: silence means "checked", never "could not check".

A rule that fires keeps running (later findings are recorded) unless its actions say
``stoptraining`` and the finding is certain (``StepResult.certain``): uncertain findings are
reported, they never stop anything. A rule that raises is isolated: it gets ``Error`` with the exception text and
the others go on. Missing tensors are reported in the status details, never raised.

With ``progress_file`` the runner's state is saved after every evaluated step (throttled to
``progress_interval``; at once on every finding and transition), so a restarted runner carries on
after the last saved step and records no finding twice. It keeps
``<output_dir>/rule-output/<RuleConfigurationName>.json``; ``output_dir`` defaults to the run
directory for a local run, and for an ``s3://`` run to the run's prefix, or for SageMaker's
layout (``<job>/debug-output``) to the job prefix next to it, where reports look.

Run as a process: ``python -m trainguard.rules RUN --rule NAME ...`` (same options as
``trainguard rules run``).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.errors import (
    ConfigError,
    FormatError,
    NoMoreData,
    StepNotYetAvailable,
    StorageError,
    TrialError,
    WaitTimeout,
)
from trainguard.modes import ModeKeys
from trainguard.rules.actions import spec_actions, stops_training
from trainguard.rules.base import Rule, RuleStatus, StepResult
from trainguard.rules.compat import make_rule, validate_specs
from trainguard.rules.progress import RuleProgress, load_progress
from trainguard.rules.read_cache import StepReadCache
from trainguard.rules.runner_notes import capture_stopped_note, damage_note, describe_missing
from trainguard.rules.runner_open import NothingCaptured, RunOpener
from trainguard.rules.runner_results import RunnerResults, issue_steps
from trainguard.rules.runner_workers import RunnerWorkers, evaluates_per_worker, on_worker, overrides
from trainguard.rules.spec import RuleSpec
from trainguard.rules.status_update import StatusUpdate

__all__ = ["NOT_EVALUATED_PREFIX", "RuleRunner", "StatusUpdate", "evaluates_per_worker", "validate_specs"]

# Built-in rules never write into the arrays they read: they may share the decoded tensors.
_BUILTIN_PREFIX = "trainguard.rules.builtin."

logger = logging.getLogger("trainguard.rules")

# Status details of a rule that could not evaluate the run (SageMaker's Error status).
NOT_EVALUATED_PREFIX = "RuleNotEvaluated:"
# A rule that found nothing on a run with damaged files (Trial.damage) ends Error with this.
DAMAGED_PREFIX = "RunDamaged:"
# Consecutive failed polls of the store (network, permissions) before every rule gets Error, and
# the least time they must span: an S3 endpoint restarted empty is down for seconds, then misses
# objects until the uploader's next verification (every 10 s) has sent them again.
_MAX_STORE_FAILURES = 30
_STORE_FAILURE_GRACE_S = 120.0


class _StoreUnavailable(Exception):
    """A rule's read of a step failed in the store (endpoint unreachable, object gone): the loop
    retries that step like a failed poll instead of ending the rule in Error, since an S3 that
    restarts has every file back seconds later (bench/chaos_stack.py, restart-s3-empty)."""


class RuleRunner:
    """Evaluates rule configurations on one run as it is written. See the module docstring.

    The runner holds the loop; it has a :class:`RunnerResults` (statuses, findings, files), and once
    the run is open a :class:`RunnerWorkers` (per-worker instances, late workers' steps).

    Args:
        trial_path: the run (hook ``out_dir``): a directory or ``s3://bucket/prefix``.
        specs: the rule configurations; names must be unique.
        progress_file: JSON file to resume from and save progress to.
        output_dir: where ``rule-output/<name>.json`` goes; default the run directory if local.
        start_step, end_step: evaluate global steps ``start_step <= s < end_step`` only.
        endpoint_url: S3-compatible endpoint for ``s3://`` runs.
        poll_interval: seconds between polls of the run.
        on_update: called with a :class:`StatusUpdate` on every transition and finding.
        stop_event: set it to end the run early (rules still in progress become ``Stopped``).
        training_done: set it when the training process is known to be gone without an end
            marker; the runner then evaluates what is there, calls ``finish()`` and ends.
        wait_timeout: seconds to wait for the run to appear.
        progress_interval: at most this often (seconds) the progress file is rewritten for
            steps without findings.

    Raises:
        ConfigError: see :func:`validate_specs`; bad step range or poll interval.
    """

    def __init__(
        self,
        trial_path: str,
        specs: list[RuleSpec],
        *,
        progress_file: str | None = None,
        output_dir: str | None = None,
        start_step: int | None = None,
        end_step: int | None = None,
        endpoint_url: str | None = None,
        poll_interval: float = 0.5,
        on_update: Callable[[StatusUpdate], None] | None = None,
        stop_event: threading.Event | None = None,
        training_done: threading.Event | None = None,
        wait_timeout: float = 1800.0,
        progress_interval: float = 0.05,
        other_trials: Sequence[Any] = (),
    ) -> None:
        from trainguard.storage import is_remote, sidecar_root

        self.trial_path = str(trial_path)
        self.specs = list(specs)
        self.classes = validate_specs(self.specs)
        if poll_interval <= 0:
            raise ConfigError(f"poll_interval={poll_interval!r} must be a positive number of seconds")
        if start_step is not None and end_step is not None and end_step <= start_step:
            raise ConfigError(f"end_step={end_step} must be greater than start_step={start_step} (end is exclusive)")
        self.progress_file = progress_file
        # Local runs keep their rule output inside the run; runs on S3 next to it as SageMaker's
        # layout does (<job>/rule-output beside <job>/debug-output), where reports look for it.
        if output_dir is None:
            output_dir = sidecar_root(self.trial_path) if is_remote(self.trial_path) else self.trial_path
        self.output_dir = output_dir
        self.start_step = start_step
        self.end_step = end_step
        self.endpoint_url = endpoint_url
        self.poll_interval = float(poll_interval)
        self.stop_event = stop_event or threading.Event()
        self.training_done = training_done or threading.Event()
        self.wait_timeout = float(wait_timeout)
        self.progress_interval = float(progress_interval)
        self.other_trials = list(other_trials)
        self._opener = RunOpener(
            self.trial_path, endpoint_url=endpoint_url, poll_interval=self.poll_interval,
            wait_timeout=self.wait_timeout, stop_event=self.stop_event, training_done=self.training_done,
        )  # fmt: skip
        self.trial: Any = None
        self.rules: dict[str, Rule] = {}
        self.progress: dict[str, RuleProgress] = {}
        self._rule_names = {spec.name: cls.name() for spec, cls in zip(self.specs, self.classes.values(), strict=True)}
        self._results = RunnerResults(
            self.progress, trial_path=self.trial_path, progress_file=progress_file,
            progress_interval=self.progress_interval, output_dir=output_dir, endpoint_url=endpoint_url,
            stop_on_fire={spec.name: stops_training(spec_actions(spec)) for spec in self.specs}, on_update=on_update,
        )  # fmt: skip

    # -- public --------------------------------------------------------------------------------
    def run(self) -> dict[str, StatusUpdate]:
        """Evaluate until training ends (or ``stop_event``); the final update per configuration."""
        self._load_progress()
        try:
            self.trial = self._opener.open()
        except NothingCaptured as error:
            # Nothing to judge is "not evaluated", never "no issues" (and never a hang).
            for name in self.progress:
                self._results.set_status(name, RuleStatus.ERROR, f"{NOT_EVALUATED_PREFIX} {error}"[:1024])
            self._results.save(force=True)
            return dict(self.latest)
        except TrialError as error:
            for name in self.progress:
                self._results.set_error(name, f"TrialUnavailable: {error}")
            self._results.save(force=True)
            return dict(self.latest)
        if self.trial is None:  # stopped while waiting
            self._stop_all("rule evaluation was stopped before the run appeared")
            return dict(self.latest)
        self.read_cache = StepReadCache(self.trial)
        self._workers = RunnerWorkers(
            self.trial, self.specs, self.progress, other_trials=self.other_trials,
            start_step=self.start_step, end_step=self.end_step,
        )  # fmt: skip
        self._create_rules()
        self._loop()
        return dict(self.latest)

    @property
    def active(self) -> list[str]:
        """The configurations still evaluating."""
        return [name for name in self.rules if not self.progress[name].finished]

    @property
    def latest(self) -> dict[str, StatusUpdate]:
        """The latest update per configuration."""
        return self._results.latest

    @property
    def on_update(self) -> Callable[[StatusUpdate], None] | None:
        return self._results.on_update

    @on_update.setter
    def on_update(self, callback: Callable[[StatusUpdate], None] | None) -> None:
        self._results.on_update = callback

    @property
    def worker_rules(self) -> dict[str, dict[str, Rule]]:
        """Configuration -> worker -> that worker's instance (per-worker rules; empty until the run opens)."""
        workers = getattr(self, "_workers", None)
        return workers.worker_rules if workers is not None else {}

    def diagnosis(self) -> dict[str, Any]:
        """The run's diagnosis so far over every configuration (see :mod:`trainguard.rules.diagnosis`)."""
        return self._results.diagnosis()

    # -- setup ---------------------------------------------------------------------------------
    def _load_progress(self) -> None:
        saved = load_progress(self.progress_file, self.trial_path) if self.progress_file else {}
        for spec in self.specs:
            state = saved.get(spec.name) or RuleProgress(spec.name, self._rule_names[spec.name])
            if not state.finished and state.status in (RuleStatus.ERROR.value, RuleStatus.STOPPED.value):
                # A restart retries a rule that errored or was stopped, from its last saved step.
                state.status, state.status_details, state.error = RuleStatus.IN_PROGRESS.value, "", False
            if not state.finished and state.status == RuleStatus.NO_ISSUES_FOUND.value:
                state.status = RuleStatus.IN_PROGRESS.value
            self.progress[spec.name] = state
            for finding in state.findings:  # a restart resumes the diagnosis too
                if finding.get("fired"):
                    self._results.note_finding(spec.name, finding)

    def _create_rules(self) -> None:
        for spec in self.specs:
            state = self.progress[spec.name]
            try:
                self.rules[spec.name] = make_rule(self.trial, spec, self.other_trials)
            except Exception as error:  # noqa: BLE001 - one bad rule must not stop the others
                self.rules[spec.name] = None  # type: ignore[assignment]
                state.finished = True
                self._results.set_error(spec.name, f"{type(error).__name__}: {error}")
                continue
            self._workers.add(spec.name, self.rules[spec.name], evaluates_per_worker(self.rules[spec.name]))
            if state.finished:
                self._results.emit(spec.name, RuleStatus(state.status), state.status_details)
            else:
                status = RuleStatus.ISSUES_FOUND if issue_steps(state.findings) else RuleStatus.IN_PROGRESS
                state.status = status.value
                self._results.emit(spec.name, status, state.status_details if state.fired_steps else "")
        self.rules = {name: rule for name, rule in self.rules.items() if rule is not None}
        self._results.save(force=True)

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        store_failures = 0
        failing_since = 0.0
        while True:
            if self.stop_event.is_set():
                self._stop_all("rule evaluation was stopped before training ended")
                return
            try:
                done_signal = self.training_done.is_set()
                if done_signal:
                    self.trial.refresh(force=True)
                ended = self.trial.training_ended or done_signal
                steps = self._ready_steps(ended)
                for step in steps:
                    if self.stop_event.is_set():
                        break
                    self._evaluate_step(step)
                if not self.stop_event.is_set():
                    self._catch_up_late_workers()
                store_failures = 0
            except (StorageError, TrialError, _StoreUnavailable) as failure:
                error: BaseException = failure
                if isinstance(failure, _StoreUnavailable) and failure.__cause__ is not None:
                    error = failure.__cause__  # the store's own error, named in the log and status
                if store_failures == 0:
                    failing_since = time.monotonic()
                store_failures += 1
                logger.warning("trainguard rules: reading %s failed (%s); retrying", self.trial_path, error)
                if store_failures >= _MAX_STORE_FAILURES and time.monotonic() - failing_since >= _STORE_FAILURE_GRACE_S:
                    for name in self.active:
                        self._results.set_error(
                            name, f"{type(error).__name__}: reading the run failed {store_failures} times: {error}"
                        )
                    self._results.save(force=True)
                    return
                self.stop_event.wait(self.poll_interval)
                continue
            if self.stop_event.is_set():
                continue
            self._idle_checks(had_steps=bool(steps))
            last_seen = self._last_seen_step()
            past_end = self.end_step is not None and last_seen is not None and last_seen >= self.end_step - 1
            if ended or past_end or not self.active:
                self._finish_all()
                return
            self._results.save()
            self.stop_event.wait(self.poll_interval)

    def _cursor(self) -> int | None:
        cursors = [self.progress[name].last_evaluated_step for name in self.active]
        if any(cursor is None for cursor in cursors):
            return None
        return min(cursors, default=None)  # type: ignore[type-var]

    def _last_seen_step(self) -> int | None:
        return self.trial.last_complete_step

    def _ready_steps(self, ended: bool) -> list[int]:
        """New complete global steps in range, in order. Reads the trial's listing directly:
        ``trial.steps()`` re-checks completeness of every step, which is quadratic on long runs."""
        state = self.trial._state
        last = max(state.steps, default=None) if ended else self.trial.last_complete_step
        if last is None:
            return []
        cursor = self._cursor()
        low = -1 if cursor is None else cursor
        if self.start_step is not None:
            low = max(low, self.start_step - 1)
        high = last if self.end_step is None else min(last, self.end_step - 1)
        shared = getattr(self.trial, "_cached_steps", None)
        if shared is None:
            return sorted(step for step in list(state.steps) if low < step <= high)
        ordered = shared(ModeKeys.GLOBAL, True)  # sorted, cached by the trial: no sort per poll
        return ordered[bisect.bisect_right(ordered, low) : bisect.bisect_right(ordered, high)]

    def _evaluate_step(self, step: int) -> None:
        for name in self.active:
            state = self.progress[name]
            if state.last_evaluated_step is not None and step <= state.last_evaluated_step:
                continue
            rule = self.rules[name]
            if overrides(rule, "check"):
                self.read_cache.share_read_only = type(rule).__module__.startswith(_BUILTIN_PREFIX)
                try:
                    instances = self._workers.instances(name, step)
                except Exception as error:  # noqa: BLE001 - a rule that cannot be made for a worker
                    self._results.rule_failed(name, error, f"while creating it for the workers of step {step}")
                    continue
                for worker, instance in instances:
                    if not self._evaluate_instance(name, worker, instance, step):
                        break
                if state.error:
                    continue
                state.last_evaluated_step = step
            state.last_evaluated_step = step
            self._results.step_evaluated(name)
        self._results.save()

    def _record(self, name: str, result: StepResult | None) -> None:
        """Every result of every rule instance passes here (services/rule_runner overrides it to
        count each evaluated step), then goes to the results part."""
        self._results.record(name, result)

    def _evaluate_instance(self, name: str, worker: str | None, instance: Rule, step: int) -> bool:
        """One rule instance on one step, its result recorded; False once the rule is done for
        good (a stop action, an error)."""
        try:
            result = instance.evaluate(step)
        except (StepNotYetAvailable, NoMoreData, WaitTimeout):
            result = None
        except FormatError:  # a damaged step: the trial keeps it in damage(), reported at the end
            result = None
        except StorageError as error:  # the store, not the rule: the loop retries the step
            raise _StoreUnavailable(str(error)) from error
        except Exception as error:  # noqa: BLE001 - isolate the rule
            where = f"while evaluating step {step}" + (f" of {worker}" if worker else "")
            self._results.rule_failed(name, error, where)
            return False
        self._workers.worker_evaluated(name, worker, step)
        self._record(name, on_worker(result, worker))
        return not self.progress[name].finished

    def _catch_up_late_workers(self) -> None:
        """Steps a worker wrote after the cursor had passed them (see
        :mod:`trainguard.rules.runner_workers`), evaluated by that worker's instance."""
        evaluated = False
        for name in self.active:
            if not overrides(self.rules[name], "check"):
                continue
            for worker, step in self._workers.late_steps(name):
                try:
                    instance = self._workers.worker_instance(name, worker)
                except Exception as error:  # noqa: BLE001 - a rule that cannot be made for a worker
                    self._results.rule_failed(name, error, f"while creating it for {worker}")
                    break
                evaluated = True
                self._results.step_evaluated(name)
                if not self._evaluate_instance(name, worker, instance, step):
                    break
        if evaluated:
            self._results.save()

    def _idle_checks(self, had_steps: bool) -> None:
        now = time.time()
        for name in self.active:
            rule = self.rules[name]
            if not overrides(rule, "check_idle") or (had_steps and rule.kind != "profiler"):
                continue
            for worker, instance in self._workers.instances(name):
                try:
                    result = instance.check_idle(now)
                except Exception as error:  # noqa: BLE001
                    self._results.rule_failed(name, error, "in check_idle")
                    break
                self._record(name, on_worker(result, worker))

    def _finish_all(self) -> None:
        stopped_early = capture_stopped_note(self.trial)
        damaged = damage_note(self.trial)
        for name in self.active:
            state = self.progress[name]
            for worker, instance in self._workers.instances(name):
                try:
                    result = instance.finish()
                except Exception as error:  # noqa: BLE001
                    self._results.rule_failed(name, error, "in finish() after training ended")
                    break
                self._record(name, on_worker(result, worker))
                if state.finished:
                    break
            if state.finished:  # a stop action after the final finding, or an error
                continue
            state.finished = True
            missing = "; ".join(describe_missing(item) for item in state.missing)
            final = self._results.final_details(name)
            if final is not None and (final[0] == RuleStatus.ISSUES_FOUND or not (damaged or stopped_early)):
                self._results.set_status(name, *final)  # advice on damaged or cut data is not "no issues"
            elif not state.evaluated:
                self._note_inapplicable(name)
                why = state.not_evaluated or (f"missing data: {missing}" if missing else "")
                why = why or "no evaluated step had the data this rule needs"
                self._results.set_status(name, RuleStatus.ERROR, f"{NOT_EVALUATED_PREFIX} {why}"[:1024])
            elif damaged:  # "no issues" in data that cannot be trusted is not "no issues"
                self._results.set_status(name, RuleStatus.ERROR, f"{DAMAGED_PREFIX} {damaged}"[:1024])
            elif stopped_early:  # "no issues" in a tenth of the run is not "no issues"
                why = f"evaluated up to step {state.last_evaluated_step} only: {stopped_early}"
                self._results.set_status(name, RuleStatus.ERROR, f"{NOT_EVALUATED_PREFIX} {why}"[:1024])
            else:
                details = f"Missing data: {missing}" if missing else ""
                self._results.set_status(name, RuleStatus.NO_ISSUES_FOUND, details)
        self._results.save(force=True)

    def _note_inapplicable(self, name: str) -> None:
        """Ask a rule that never evaluated a step whether it applies to this run at all
        (``Rule.inapplicable``: its framework, collections its model has none of)."""
        state = self.progress[name]
        if state.not_applicable:
            return
        for _worker, instance in self._workers.instances(name):
            try:
                reason = instance.inapplicable()
            except Exception:  # noqa: BLE001 - no answer: the rule stays "could not evaluate"
                logger.debug("trainguard rules: %s.inapplicable() failed", name, exc_info=True)
                return
            if reason:
                state.not_evaluated, state.not_applicable = reason, True
            return

    def _stop_all(self, why: str) -> None:
        for name, state in self.progress.items():
            if state.finished or state.status in (RuleStatus.ERROR.value,):
                continue
            if issue_steps(state.findings):
                self._results.set_status(name, RuleStatus.ISSUES_FOUND, self._results.first_fired_details(name))
            else:
                step = state.last_evaluated_step
                self._results.set_status(name, RuleStatus.STOPPED, f"{why} (last evaluated step: {step})")
        self._results.save(force=True)
