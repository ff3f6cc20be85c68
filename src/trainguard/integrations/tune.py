"""Ray Tune: stop a trial when trainguard's rules find a certain issue in its training.

    from ray import tune
    from trainguard.integrations.tune import TrainguardStopper, TuneGuard

    def trainable(config):
        out_dir = os.path.join(tune.get_context().get_trial_dir(), "trainguard")
        with TuneGuard(out_dir) as guard:            # the rules follow out_dir as it is written
            for epoch in range(epochs):
                loss = train_one_epoch(config, hook_out_dir=out_dir)
                if guard.report({"loss": loss}, wait_for_step=last_saved_step):
                    break                            # a rule found an issue: stop training

    tuner = tune.Tuner(trainable, param_space=...,
                       run_config=tune.RunConfig(stop=TrainguardStopper()))

The rules run inside the trial's own process (:class:`~trainguard.integrations.live.
LiveRuleMonitor`), next to its capture, so this works on a multi-node cluster with a local
capture. :meth:`TuneGuard.report` adds to every result:

* ``trainguard_stop``: True once a rule found a *certain* issue (``StepResult.certain``);
* ``trainguard_issue``: ``"<Rule> at step <N>: <message>"`` (empty while there is none), and
  ``trainguard_rule`` / ``trainguard_step`` / ``trainguard_finding`` (the whole finding as a dict);

and :class:`TrainguardStopper` stops the trials whose result says ``trainguard_stop``, so the
finding is in the trial's last result (``result_grid[i].metrics``). Uncertain findings never stop
a trial. Ray is imported only when this module is (``pip install 'trainguard[tune]'``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ray import tune

from trainguard.integrations.live import Finding, LiveRuleMonitor
from trainguard.rules.spec import RuleSpec

__all__ = ["STOP_KEY", "TrainguardStopper", "TuneGuard", "finding_metrics"]

STOP_KEY = "trainguard_stop"


def finding_metrics(finding: Finding | None) -> dict[str, Any]:
    """The result entries that carry a finding (or say there is none) to Tune."""
    if finding is None:
        return {STOP_KEY: False, "trainguard_issue": "", "trainguard_rule": "", "trainguard_step": -1}
    return {
        STOP_KEY: True,
        "trainguard_issue": finding.summary(),
        "trainguard_rule": finding.rule,
        "trainguard_step": finding.step,
        "trainguard_finding": finding.to_dict(),
    }


class TuneGuard:
    """trainguard's rules watching one Tune trial's capture; see the module docstring.

    Args:
        out_dir: the trial's capture (its hook's ``out_dir``); one directory per trial.
        rules: rule configurations or names (default: the default rule set).
        monitor_options: passed to :class:`~trainguard.integrations.live.LiveRuleMonitor`.
    """

    def __init__(self, out_dir: str, rules: Sequence[RuleSpec | str] | None = None, **monitor_options: Any) -> None:
        self.monitor = LiveRuleMonitor(out_dir, rules, **monitor_options)
        self.finding: Finding | None = None

    def __enter__(self) -> TuneGuard:
        self.monitor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.monitor.close()

    def check(self, wait_for_step: int | None = None, timeout: float = 10.0) -> Finding | None:
        """The first certain finding so far (after the rules caught up with ``wait_for_step``)."""
        findings = self.monitor.poll(wait_for_step=wait_for_step, timeout=timeout)
        if self.finding is None and findings:
            self.finding = findings[0]
        return self.finding

    def report(self, metrics: Mapping[str, Any], wait_for_step: int | None = None, timeout: float = 10.0) -> bool:
        """``tune.report`` the metrics with trainguard's verdict; True when training should stop.

        ``wait_for_step``: the last step the hook saved; the rules first catch up with it (at
        most ``timeout`` seconds), so the verdict does not depend on how busy the machine is.
        """
        finding = self.check(wait_for_step, timeout)
        tune.report({**metrics, **finding_metrics(finding)})
        return finding is not None


class TrainguardStopper(tune.Stopper):
    """Stops each trial whose latest result says ``trainguard_stop`` (see :class:`TuneGuard`)."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(result.get(STOP_KEY))

    def stop_all(self) -> bool:
        return False
