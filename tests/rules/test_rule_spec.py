"""The command-line form of a rule configuration."""

from __future__ import annotations

import pytest

from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec


@pytest.mark.parametrize(
    ("text", "rule", "parameters"),
    [
        ("VanishingGradient", "VanishingGradient", {}),
        ("VanishingGradient:threshold=1e-6", "VanishingGradient", {"threshold": "1e-6"}),
        ("AllZero:tensor_regex=.*bias,.*weight,threshold=90", "AllZero", {"tensor_regex": ".*bias,.*weight", "threshold": "90"}),
        ("LossNotDecreasing:collection_names=losses,default", "LossNotDecreasing", {"collection_names": "losses,default"}),
        ("my.rules:Custom", "my.rules:Custom", {}),
        ("my.rules:Custom:limit=3,names=a,b", "my.rules:Custom", {"limit": "3", "names": "a,b"}),
    ],
)
def test_parse(text, rule, parameters):
    spec = RuleSpec.parse(text)
    assert (spec.rule, dict(spec.parameters), spec.name) == (rule, parameters, rule)


@pytest.mark.parametrize("text", ["", "  ", "AllZero:=3"])
def test_bad_forms_are_config_errors(text):
    with pytest.raises(ConfigError):
        RuleSpec.parse(text)


def test_other_trials_as_a_parameter_reach_the_rule(tmp_path):
    import numpy as np

    from tests.rules.synthetic import open_trial, write_run
    from trainguard.rules import create_rule

    for name, value in (("a", 1.0), ("same", 1.0), ("other", 2.0)):
        write_run(tmp_path / name, {0: {"w": np.ones(3)}, 1: {"w": np.full(3, value)}}, finished=True)
    fired = {}
    for other in ("same", "other"):
        rule = create_rule(open_trial(tmp_path / "a"), RuleSpec("SimilarAcrossRuns", {"other_trials": str(tmp_path / other)}))
        fired[other] = rule.evaluate(1).fired
    assert fired == {"same": False, "other": True}
