"""A custom rule with a controlled sequence of findings, for the stop-policy tests:
``tests.services.rules_for_stop_policy:UncertainThenCertain``.

Uncertain findings at every saved step from ``uncertain_from`` on, a certain one from
``certain_at`` on (``certain_at < 0``: never certain). No built-in rule's calibration decides
when the job should stop, only the sequence the test asks for.
"""

from __future__ import annotations

from trainguard.rules import Param, Rule, StepResult


class UncertainThenCertain(Rule):
    """Uncertain findings from ``uncertain_from``, certain ones from ``certain_at``."""

    rule_name = "UncertainThenCertain"
    fix_hint = "nothing to fix: a test rule"
    collections = ("losses",)
    uncertain_from = Param(int, 0, "first step with an (uncertain) finding")
    certain_at = Param(int, -1, "first step with a certain finding (< 0: none)")
    stop_policy = "stops training from certain_at on"

    def check(self, step: int) -> StepResult | None:
        if not self.select_tensors(collection_names=["losses"], step=step):
            return None
        if 0 <= self.certain_at <= step:
            return self.issue(step, f"certain finding at step {step}", certain=True)
        if step >= self.uncertain_from:
            return self.issue(step, f"uncertain finding at step {step}", certain=False)
        return self.no_issue(step)
