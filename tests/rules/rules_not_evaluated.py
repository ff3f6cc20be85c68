"""A custom rule that can never evaluate (named by path in service tests:
``tests.rules.rules_not_evaluated:NeedsAnUnsavedTensor``)."""

from __future__ import annotations

from trainguard.rules import Rule, StepResult


class NeedsAnUnsavedTensor(Rule):
    """Needs a tensor no training script saves; says so at every step."""

    rule_name = "NeedsAnUnsavedTensor"
    collections = ("losses",)

    def check(self, step: int) -> StepResult | None:
        return self.not_evaluated("the tensor 'never_saved' is not in this run", step)
