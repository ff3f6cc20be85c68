"""The calibration fault suite: real PyTorch runs with planted faults, and healthy baselines.

Every planted fault must fire the rules its case names (with default parameters); no built-in
debugger rule may fire on a healthy baseline. docs/rules-calibration.md is this suite's table
(``python -m tests.rules.fault_suite.report``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.rules.fault_suite.evaluate import debugger_rules
from tests.rules.fault_suite.runs import CASES, Case, train
from tests.rules.synthetic import evaluate_rule, first_firing
from trainguard.rules import RuleSpec

FAULTS = [case for case in CASES if not case.healthy]
HEALTHY = [case for case in CASES if case.healthy]


def available(rules):
    """Rules of a case that exist in this checkout (the loss rules come from another module set)."""
    known = set(debugger_rules())
    return [rule for rule in rules if rule in known]


@pytest.mark.parametrize("case", FAULTS, ids=[case.name for case in FAULTS])
def test_planted_fault_fires_its_rules(suite_runs, case):
    rules = available(case.expected)
    if not rules:
        pytest.skip(f"none of {case.expected} is a built-in rule here")
    outcomes = suite_runs.outcomes(case, rules)
    silent = {rule: outcomes[rule] for rule in rules if outcomes[rule].fired_at is None}
    assert not silent, f"{case.name} ({case.description}): {sorted(silent)} did not fire: {silent}"


@pytest.mark.parametrize("case", HEALTHY, ids=[case.name for case in HEALTHY])
def test_no_rule_fires_on_a_healthy_run(suite_runs, case):
    outcomes = suite_runs.outcomes(case)
    fired = {name: f"step {o.fired_at}: {o.message}" for name, o in outcomes.items() if o.fired_at is not None}
    assert not fired, f"{case.name} ({case.description}) is healthy but rules fired: {fired}"
    evaluated = [name for name, o in outcomes.items() if o.evaluated]
    # the tensor rules really looked at the run (not silent because they found nothing to read)
    for rule in (
        "VanishingGradient",
        "ExplodingTensor",
        "WeightUpdateRatio",
        "DeadRelu",
        "UnchangedTensor",
        "AllZero",
        "PoorWeightInitialization",
        "LossNotDecreasing",
    ):
        if rule in outcomes:
            assert rule in evaluated, f"{rule} evaluated no step of {case.name}"


def test_similar_across_runs_on_real_runs(suite_runs, tmp_path):
    """Same config and seed on one CPU thread → identical tensors; another seed → differs at step 0."""
    base_case = next(case for case in HEALTHY if case.name == "healthy-mlp-sgd-noval-s1")
    base = suite_runs.path(base_case)
    again = train(str(tmp_path / "again"), base_case.config)
    other_seed = suite_runs.path(Case("seed-2", replace(base_case.config, seed=2), kind="healthy"))
    assert first_firing(evaluate_rule(base, _spec(again))) is None
    assert first_firing(evaluate_rule(base, _spec(other_seed))) == 0


def _spec(other: str) -> RuleSpec:
    return RuleSpec("SimilarAcrossRuns", {"other_trial_0": other})
