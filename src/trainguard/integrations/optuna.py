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
says so, or when a rule found a *certain* issue (``StepResult.certain``); then the finding is
stored on the trial as user attribute ``trainguard_finding`` (rule, configuration_name, step,
message, certain, worker, fix_hint) and ``guard.reason`` says it in one line. Uncertain findings
never prune a trial.

Optuna is imported only when this module is (``pip install 'trainguard[optuna]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.integrations.live import Finding, LiveRuleMonitor
from trainguard.rules.spec import RuleSpec

__all__ = ["FINDING_ATTR", "TrialGuard"]

FINDING_ATTR = "trainguard_finding"


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
        self.monitor = LiveRuleMonitor(out_dir, rules, **monitor_options)
        self.finding: Finding | None = None

    def __enter__(self) -> TrialGuard:
        self.monitor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish the rules (bounded); a certain finding made after the last check is recorded too."""
        self.monitor.close()
        self._take(self.monitor.poll())

    def should_prune(self, wait_for_step: int | None = None, timeout: float = 10.0) -> bool:
        """True when a rule found a certain issue or the study's pruner prunes the trial.

        ``wait_for_step``: the last step the hook saved; the rules first catch up with it (at
        most ``timeout`` seconds), so the decision does not depend on how busy the machine is.
        """
        self._take(self.monitor.poll(wait_for_step=wait_for_step, timeout=timeout))
        return self.finding is not None or bool(self.trial.should_prune())

    @property
    def reason(self) -> str:
        """Why the trial is pruned, in one line."""
        if self.finding is not None:
            return f"trainguard: {self.finding.summary()}"
        return "pruned by the study's pruner"

    def _take(self, findings: list[Finding]) -> None:
        if self.finding is None and findings:
            self.finding = findings[0]
            self.trial.set_user_attr(FINDING_ATTR, self.finding.to_dict())
