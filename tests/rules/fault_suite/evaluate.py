"""Run every built-in rule, with its defaults, over a finished run: the first firing step per rule."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, builtin_rules, create_rule
from trainguard.trial import create_trial

# Rules the suite cannot run with defaults alone: they compare with other runs, need user
# thresholds, or watch wall-clock time rather than steps.
NEEDS_MORE_THAN_A_RUN = {"SimilarAcrossRuns": "needs other_trials", "StalledTrainingRule": "wall-clock rule"}


def debugger_rules() -> list[str]:
    """Built-in rules that read tensors (profiler rules read profiler data the suite does not record)."""
    return [name for name, rule in builtin_rules().items() if getattr(rule, "kind", "debugger") == "debugger"]


@dataclass
class Outcome:
    rule: str
    fired_at: int | None  # first step that fired (None: never)
    evaluated: int  # steps with a result (fired or not), missing-data results excluded
    missing: bool  # the run lacks what the rule reads
    skipped: str = ""  # why the rule was not run
    message: str = ""  # the first finding's message


def evaluate_rules(path: str, rules: list[str] | None = None) -> dict[str, Outcome]:
    """Evaluate ``rules`` (default: every built-in) with default parameters over the run at ``path``."""
    trial = create_trial(path, collection_wait_timeout=5)
    steps = trial.steps()
    outcomes: dict[str, Outcome] = {}
    for name in rules or debugger_rules():
        if name in NEEDS_MORE_THAN_A_RUN:
            outcomes[name] = Outcome(name, None, 0, False, NEEDS_MORE_THAN_A_RUN[name])
            continue
        try:
            rule = create_rule(trial, RuleSpec(name))
        except ConfigError as error:
            outcomes[name] = Outcome(name, None, 0, False, f"needs parameters: {error}")
            continue
        outcomes[name] = run_rule(rule, steps)
    return outcomes


def run_rule(rule: Any, steps: list[int]) -> Outcome:
    fired_at, evaluated, missing, message = None, 0, False, ""
    for step in steps:
        result = rule.evaluate(step)
        if result is None:
            continue
        json.dumps(result.to_dict())  # findings go to rule-output JSON files: must serialise
        if result.missing:
            missing = True
            continue
        evaluated += 1
        if result.fired and fired_at is None:
            fired_at, message = step, result.message
            break  # SageMaker's rule stops at the first condition met
    if fired_at is None:
        final = rule.finish()
        if final is not None and final.fired:
            fired_at, message = final.step, final.message
    return Outcome(rule.name(), fired_at, evaluated, missing and evaluated == 0, "", message)
