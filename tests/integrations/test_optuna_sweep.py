"""A real Optuna study (examples/sweeps/optuna_sweep.py): 4 small PyTorch trainings captured by
the hook, the default rules running live beside each; the two bad configurations are pruned early
with the finding stored on the trial, the two good ones run all their steps unpruned."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
optuna = pytest.importorskip("optuna")

from tests.integrations._sweeps import EXPECTED_RULES, GOOD, load_example  # noqa: E402
from trainguard.integrations.optuna import FINDING_ATTR  # noqa: E402


def test_optuna_study_prunes_the_bad_trials_early(tmp_path):
    example = load_example("optuna_sweep")
    configs = example.toy_training.CONFIGS
    study = example.run_sweep(str(tmp_path))
    assert len(study.trials) == len(configs)
    by_name = {config["name"]: trial for config, trial in zip(configs, study.trials, strict=True)}
    full = max(trial.user_attrs["steps"] for trial in study.trials)
    for name in GOOD:
        trial = by_name[name]
        assert trial.state == optuna.trial.TrialState.COMPLETE, (name, trial.user_attrs)
        assert FINDING_ATTR not in trial.user_attrs
        assert trial.user_attrs["steps"] == full
    for name, rules in EXPECTED_RULES.items():
        trial = by_name[name]
        finding = trial.user_attrs.get(FINDING_ATTR)
        assert trial.state == optuna.trial.TrialState.PRUNED, (name, trial.user_attrs)
        assert finding is not None and finding["certain"] is True
        assert finding["rule"] in rules, finding
        assert finding["step"] < trial.user_attrs["steps"] < full / 2, (name, finding, trial.user_attrs["steps"])
