"""The rules following one training run's capture while it trains, asked for findings on demand.

    monitor = LiveRuleMonitor(out_dir)           # the hook's out_dir; the default rule set
    monitor.start()
    for epoch in ...:
        train_one_epoch()                        # the hook writes the capture
        findings = monitor.poll(wait_for_step=hook_step)
        if findings: break                       # certain findings only, by default
    monitor.close()

The rules run in :class:`~trainguard.rules.runner.RuleRunner` (the same runner as
``trainguard rules run`` and ``trainguard run --rules``) on a daemon thread of the calling
process, so a sweep trial needs no extra process and works wherever the trial runs (its capture is
local to it). Only *certain* findings (``StepResult.certain``: non-finite values, a condition
confirmed over its persistence window) are returned by default: uncertain ones are kept in
:attr:`LiveRuleMonitor.uncertain` and never stop a trial, since a sweep that kills healthy trials
is worse than none.

Fail open: a runner that cannot start or crashes is logged and the monitor reports no findings;
training is never stopped or slowed down because trainguard failed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from trainguard.rules.runner import RuleRunner, StatusUpdate
from trainguard.rules.spec import RuleSpec

__all__ = ["Finding", "LiveRuleMonitor", "default_hook_collections"]

logger = logging.getLogger("trainguard.integrations")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rule finding, in the form a sweep stores with the trial it stopped."""

    rule: str
    configuration_name: str
    step: int
    message: str
    certain: bool
    worker: str | None = None
    fix_hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """One line: ``Rule at step N: message``."""
        return f"{self.rule} at step {self.step}: {self.message}"


def default_hook_collections(specs: Sequence[RuleSpec] | None = None, framework: str = "pytorch") -> list[str]:
    """The collections a ``framework`` hook must save for ``specs`` (default: the default rule set)
    to evaluate; rules of other frameworks (TreeDepth on a PyTorch run) add none."""
    from trainguard.rules.compat import validate_specs
    from trainguard.rules.defaults import BASE_COLLECTIONS, default_rule_specs, rule_collections

    classes = validate_specs(list(specs) if specs is not None else default_rule_specs())
    needed = list(BASE_COLLECTIONS)
    needed += [name for name in rule_collections(classes.values(), framework) if name not in needed]
    return needed


class LiveRuleMonitor:
    """Runs rules over one capture as it is written; :meth:`poll` returns their new findings.

    Args:
        out_dir: the capture (the hook's ``out_dir``): a directory or ``s3://bucket/prefix``.
        rules: rule configurations (``RuleSpec`` or rule names); default: the default rule set
            (:data:`trainguard.rules.defaults.DEFAULT_RULES`).
        certain_only: return only certain findings from :meth:`poll` (default).
        poll_interval: seconds between the runner's looks at the capture.
        endpoint_url: S3 endpoint for ``s3://`` captures.
        wait_timeout: seconds the runner waits for the capture to appear.
    """

    def __init__(
        self,
        out_dir: str,
        rules: Sequence[RuleSpec | str] | None = None,
        *,
        certain_only: bool = True,
        poll_interval: float = 0.05,
        endpoint_url: str | None = None,
        wait_timeout: float = 3600.0,
    ) -> None:
        from trainguard.rules.defaults import default_rule_specs

        self.out_dir = str(out_dir)
        self.endpoint_url = endpoint_url
        specs = default_rule_specs() if rules is None else [RuleSpec(r) if isinstance(r, str) else r for r in rules]
        self.specs = list(specs)
        self.certain_only = certain_only
        # What poll() returns, in the order found: the first finding of each rule configuration
        # and worker (and its first certain one); uncertain ones go to ``uncertain`` when
        # ``certain_only``, for reporting.
        self.findings: list[Finding] = []
        self.uncertain: list[Finding] = []
        self.final: dict[str, StatusUpdate] = {}
        self.failed: str | None = None  # why the runner is not running (fail open)
        self._returned = 0
        self._seen: set[tuple[str, str | None, bool]] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._training_done = threading.Event()
        self._stop = threading.Event()
        self._runner: RuleRunner | None = None
        self._written: Any = None  # the trial last_written_step reads (see there)
        self._written_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        try:
            self._runner = RuleRunner(
                self.out_dir, self.specs, poll_interval=poll_interval, endpoint_url=endpoint_url,
                on_update=self._on_update, stop_event=self._stop, training_done=self._training_done,
                wait_timeout=wait_timeout,
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - a bad rule configuration must not stop training
            self._fail(f"cannot create the rule runner: {type(error).__name__}: {error}")

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> LiveRuleMonitor:
        """Start following the capture (call before or after training begins)."""
        if self._runner is None or self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, daemon=True, name="trainguard-live-rules")
        self._thread.start()
        return self

    def __enter__(self) -> LiveRuleMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 30.0, *, stop: bool = False) -> dict[str, StatusUpdate]:
        """Training is over: evaluate what is left, finish the rules; their final statuses.

        Bounded by ``timeout`` (then the runner is stopped): closing never hangs a trial.
        ``stop``: stop the rules instead (status Stopped), for a caller that knows training has
        not ended, e.g. its capture has not appeared yet.
        """
        (self._stop if stop else self._training_done).set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("trainguard: the live rules did not finish within %.0f s; stopping them", timeout)
                self._stop.set()
                thread.join(5.0)
        return dict(self.final)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- findings ------------------------------------------------------------------------------
    def poll(self, wait_for_step: int | None = None, timeout: float = 10.0) -> list[Finding]:
        """Findings not returned by an earlier poll (certain ones only, unless ``certain_only=False``).

        With ``wait_for_step``, first wait (at most ``timeout`` seconds) until every rule still
        running has evaluated that step or a later one, or a finding arrived, or the runner
        ended: a sweep then decides on the data up to that step, not on how fast the thread
        was. Pass the last step the hook saved *and wrote*: the PyTorch hook writes a step when
        the next one begins, so after training step ``s`` (counting from 0) that is the last
        saved step <= ``s - 1``; waiting for ``s`` itself lasts the whole ``timeout``.
        """
        with self._changed:
            if wait_for_step is not None and self.running:
                deadline = time.monotonic() + max(0.0, timeout)
                while (
                    self._returned == len(self.findings)
                    and self.running
                    and not self._evaluated_through(wait_for_step)
                    and time.monotonic() < deadline
                ):
                    self._changed.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            new = self.findings[self._returned :]
            self._returned = len(self.findings)
        return list(new)

    def first_finding(self) -> Finding | None:
        """The first finding poll() returns or returned, if any."""
        with self._lock:
            return self.findings[0] if self.findings else None

    @property
    def capture_appeared(self) -> bool:
        """Whether the rules have opened the capture (its first collections file was written)."""
        return self._runner is not None and self._runner.trial is not None

    def last_written_step(self) -> int | None:
        """The newest complete step of the capture on disk; None before it appears.

        Read through a trial of the monitor's own, never the runner's: the runner opens the run
        only after polling for it (seconds on a loaded machine, while training has written dozens
        of steps) and refreshes between evaluations, so its view lags the disk; a guard judging
        "the steps written so far" through it waited for too few of them, or for none. The
        runner's trial is also read by the runner's thread, and a trial is not thread-safe.
        """
        from trainguard.errors import TrainguardError
        from trainguard.trial import create_trial

        with self._written_lock:
            try:
                if self._written is None:
                    self._written = create_trial(
                        self.out_dir, endpoint_url=self.endpoint_url, collection_wait_timeout=0
                    )
                self._written.refresh(force=True)
                return self._written.last_complete_step
            except TrainguardError:
                return None  # not there yet, or the store failed: nothing written that we can see

    def evaluated_through(self, step: int) -> bool:
        """Whether every rule still running has evaluated ``step`` (or a later one)."""
        return self._evaluated_through(step)

    # -- internals -----------------------------------------------------------------------------
    def _evaluated_through(self, step: int) -> bool:
        runner = self._runner
        if runner is None or not runner.rules:  # not started evaluating yet (capture not there)
            return False
        for name in runner.active:
            last = runner.progress[name].last_evaluated_step
            if last is None or last < step:
                return False
        return True

    def _run(self) -> None:
        assert self._runner is not None
        try:
            self.final = self._runner.run()
        except Exception as error:  # noqa: BLE001 - fail open: log, report nothing
            self._fail(f"the rule runner crashed: {type(error).__name__}: {error}")
        finally:
            with self._changed:
                self._changed.notify_all()

    def _fail(self, why: str) -> None:
        self.failed = why
        logger.warning("trainguard: live rules disabled for %s: %s", self.out_dir, why)

    def _on_update(self, update: StatusUpdate) -> None:
        result = update.result
        if result is None or not result.fired:
            with self._changed:
                self._changed.notify_all()  # a status transition may end a wait
            return
        finding = Finding(
            rule=update.rule,
            configuration_name=update.configuration_name,
            step=result.step,
            message=result.message,
            certain=bool(result.certain),
            worker=result.worker,
            fix_hint=result.fix_hint or "",
        )
        with self._changed:
            # A rule that keeps firing reports every step; a sweep needs its first finding (per
            # worker, and the first certain one), so the lists stay small on long runs.
            key = (finding.configuration_name, finding.worker, finding.certain)
            if key not in self._seen:
                self._seen.add(key)
                if finding.certain or not self.certain_only:
                    self.findings.append(finding)
                else:
                    self.uncertain.append(finding)
            self._changed.notify_all()
