"""Optuna: prune a trial when trainguard's rules find a certain issue in its training.

    import optuna
    from trainguard.integrations.optuna import TrialGuard

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-4, 1.0, log=True)
        out_dir = f"/tmp/sweep/trial-{trial.number}"
        with TrialGuard(trial, out_dir) as guard:     # the rules follow out_dir as it is written
            for epoch in range(epochs):
                loss = train_one_epoch(hook_out_dir=out_dir)
                trial.report(loss, epoch)
                if guard.should_prune(wait_for_step=last_saved_step):
                    raise optuna.TrialPruned(guard.reason)
        return loss

``should_prune`` has ``trial.should_prune()`` semantics: it is True when the study's own pruner
says so, or when a rule found a *certain* issue (``StepResult.certain``) in the steps written so
far; then the finding is
stored on the trial as user attribute ``trainguard_finding`` (rule, configuration_name, step,
message, certain, worker, fix_hint) and ``guard.reason`` says it in one line. Uncertain findings
never prune a trial.

Each ``should_prune`` first lets the rules catch up with the capture, boundedly: with
``wait_for_step``, until they have evaluated that step; without it, the steps written so far. A
step not written yet (the PyTorch hook writes a step when the next one begins) is waited for only
briefly, polling with a short, growing interval; then the steps written so far are judged and a
warning says which step was asked for and which was last written. A wait for the rules longer than
a few seconds is logged, naming the step and the capture.

Optuna is imported only when this module is (``pip install 'trainguard[optuna]'``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from trainguard.integrations.live import Finding, LiveRuleMonitor
from trainguard.rules.spec import RuleSpec

__all__ = ["FINDING_ATTR", "TrialGuard"]

FINDING_ATTR = "trainguard_finding"
logger = logging.getLogger("trainguard.integrations")

# How long a step asked for but not yet written is waited for (seconds): the hook's writer
# publishes a step shortly after the next one begins, so a step that is coming appears within a
# fraction of this; one that only the next training step writes never does. Halved after each
# wait in vain (a loop that asks for the step it just trained), reset when a step arrives.
WRITE_WAIT_S = 1.0
MIN_WRITE_WAIT_S = 0.05
FIRST_POLL_S, MAX_POLL_S = 0.01, 0.25  # the backing-off interval of those waits
SAY_AFTER_S = 3.0  # a wait for the rules longer than this is logged
CAPTURE_WAIT_S = 2.0  # at close: how long a capture not yet there may take to appear


class TrialGuard:
    """trainguard's rules watching one Optuna trial's capture; see the module docstring.

    Args:
        trial: the ``optuna.Trial`` the objective got.
        out_dir: the trial's capture (its hook's ``out_dir``); one directory per trial.
        rules: rule configurations or names (default: the default rule set).
        monitor_options: passed to :class:`~trainguard.integrations.live.LiveRuleMonitor`.
    """

    def __init__(
        self, trial: Any, out_dir: str, rules: Sequence[RuleSpec | str] | None = None, **monitor_options: Any
    ) -> None:
        self.trial = trial
        self.out_dir = str(out_dir)
        self.monitor = LiveRuleMonitor(out_dir, rules, **monitor_options)
        self.finding: Finding | None = None
        self._write_wait = WRITE_WAIT_S
        self._warned_unwritten = False

    def __enter__(self) -> TrialGuard:
        self.monitor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish the rules (bounded); a certain finding made after the last check is recorded too.

        Closed before its hook wrote anything (the hook closes later, or its writer is still
        starting), the guard gives the capture a moment to appear, then stops the rules (status
        Stopped) rather than report that training "ended without capturing anything"."""
        monitor = self.monitor
        if monitor.running and not monitor.capture_appeared:
            _wait_until(lambda: monitor.capture_appeared or not monitor.running, CAPTURE_WAIT_S)
        stop = monitor.running and not monitor.capture_appeared
        if stop:
            logger.info("trainguard: the guard of %s closed before its capture appeared; rules stopped", self.out_dir)
        monitor.close(stop=stop)
        self._take(monitor.poll())

    def should_prune(self, wait_for_step: int | None = None, timeout: float = 10.0) -> bool:
        """True when a rule found a certain issue or the study's pruner prunes the trial.

        The rules first catch up (at most ``timeout`` seconds), so the decision does not depend
        on how busy the machine is: with ``wait_for_step`` (the last step the hook saved and
        wrote) up to that step, without it up to the last step written so far.
        """
        self._take(self._catch_up(wait_for_step, max(0.0, timeout)))
        return self.finding is not None or bool(self.trial.should_prune())

    @property
    def reason(self) -> str:
        """Why the trial is pruned, in one line."""
        if self.finding is not None:
            return f"trainguard: {self.finding.summary()}"
        return "pruned by the study's pruner"

    def _catch_up(self, wait_for_step: int | None, timeout: float) -> list[Finding]:
        started = time.monotonic()
        deadline = started + timeout
        target = self._written_target(wait_for_step, deadline)
        findings = self.monitor.poll()
        said = False
        while not findings and target is not None and self.monitor.running:
            if self.monitor.evaluated_through(target):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not said and time.monotonic() - started >= SAY_AFTER_S:
                said = True
                logger.warning(
                    "trainguard: waiting up to %.0f s more for the rules to evaluate step %d of %s",
                    remaining, target, self.out_dir,
                )  # fmt: skip
            findings += self.monitor.poll(wait_for_step=target, timeout=min(remaining, SAY_AFTER_S))
        return findings + self.monitor.poll()

    def _written_target(self, wait_for_step: int | None, deadline: float) -> int | None:
        """The step to judge through: ``wait_for_step`` once it is written, else the last
        written step (None before the capture appears)."""
        monitor = self.monitor
        if wait_for_step is None:
            return monitor.last_written_step()

        def written() -> bool:
            last = monitor.last_written_step()
            return (last is not None and last >= wait_for_step) or not monitor.running

        if written():
            return wait_for_step
        if _wait_until(written, min(self._write_wait, max(0.0, deadline - time.monotonic()))):
            self._write_wait = WRITE_WAIT_S
            return wait_for_step
        self._write_wait = max(MIN_WRITE_WAIT_S, self._write_wait / 2)
        last = monitor.last_written_step()
        if not self._warned_unwritten:
            self._warned_unwritten = True
            logger.warning(
                "trainguard: step %d is not written to %s yet (last written: %s); judging the steps written so "
                "far. The PyTorch hook writes a step when the next one begins: pass wait_for_step=<the last saved "
                "step before the current one>",
                wait_for_step, self.out_dir, "none" if last is None else last,
            )  # fmt: skip
        return last

    def _take(self, findings: list[Finding]) -> None:
        if self.finding is None and findings:
            self.finding = findings[0]
            self.trial.set_user_attr(FINDING_ATTR, self.finding.to_dict())


def _wait_until(condition: Any, seconds: float) -> bool:
    """Poll ``condition`` with a growing interval for at most ``seconds``; whether it held."""
    deadline = time.monotonic() + seconds
    interval = FIRST_POLL_S
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, MAX_POLL_S)
    return True
