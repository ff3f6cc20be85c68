"""Rules: checks that run on a trial and report issues with a fix hint.

    from trainguard.rules import create_rule, RuleSpec
    rule = create_rule(trial, RuleSpec("VanishingGradient", {"threshold": "1e-6"}))
    result = rule.evaluate(step)       # StepResult or None (nothing to check at this step)
"""

from __future__ import annotations

from typing import Any

from trainguard.rules.base import MissingTensor, Rule, RuleStatus, StepResult
from trainguard.rules.params import Param
from trainguard.rules.registry import builtin_rules, get_rule_class, rule_names
from trainguard.rules.spec import RuleSpec

__all__ = [
    "MissingTensor",
    "Param",
    "Rule",
    "RuleSpec",
    "RuleStatus",
    "StepResult",
    "builtin_rules",
    "create_rule",
    "get_rule_class",
    "rule_names",
]


def create_rule(base_trial: Any, spec: RuleSpec | str, other_trials: Any = ()) -> Any:
    """Instantiate the rule ``spec`` names on ``base_trial``; parameters are validated here."""
    if isinstance(spec, str):
        spec = RuleSpec.parse(spec)
    rule_class = get_rule_class(spec.rule)
    parameters = dict(spec.parameters)
    # SageMaker configs may carry other_trials as a parameter (paths); an explicit argument wins.
    from_parameters = parameters.pop("other_trials", None)
    if not other_trials and from_parameters:
        other_trials = from_parameters
    return rule_class(base_trial, other_trials=other_trials, **parameters)
