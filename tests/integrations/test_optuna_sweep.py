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


def test_should_prune_keeps_the_study_pruners_verdict(tmp_path):
    """``should_prune`` is ``trial.should_prune()`` or a certain finding: a healthy trial is
    pruned by the study's pruner (loss above a threshold) with no trainguard finding."""
    toy = load_example("toy_training")
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1e-6))
    verdicts: list[bool] = []

    def objective(trial):
        from trainguard.integrations.optuna import TrialGuard

        out_dir = str(tmp_path / f"trial-{trial.number}")
        with TrialGuard(trial, out_dir) as guard:

            def on_epoch(epoch, steps, last_saved, loss):
                trial.report(loss, epoch)
                verdicts.append(guard.should_prune(wait_for_step=last_saved))
                return verdicts[-1]

            toy.train({"lr": 0.01}, out_dir, on_epoch)
        assert guard.finding is None and guard.reason == "pruned by the study's pruner"
        raise optuna.TrialPruned(guard.reason)

    study.optimize(objective, n_trials=1)
    assert verdicts == [True]
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    assert FINDING_ATTR not in study.trials[0].user_attrs
