"""The XGBoost hook on real ``xgboost.train`` runs, read back with ``create_trial``: every saved
value equals what XGBoost itself reports (evals_result, get_score, trees_to_dataframe, predict,
pred_contribs)."""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest

xgboost = pytest.importorskip("xgboost")

import trainguard.xgboost as tg  # noqa: E402 - needs xgboost
from tests.rules.synthetic import evaluate_rule, first_firing  # noqa: E402
from trainguard.errors import ConfigError  # noqa: E402
from trainguard.hooks.xgboost import IMPORTANCE_TYPES  # noqa: E402
from trainguard.modes import ModeKeys  # noqa: E402
from trainguard.trial import create_trial  # noqa: E402

PARAMS = {"objective": "binary:logistic", "max_depth": 3, "eta": 0.3, "nthread": 1}


def _data(seed=0, rows=300, features=6):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, features))
    y = (X[:, 0] + 0.5 * X[:, 1] - 0.25 * X[:, 2] + 0.3 * rng.normal(size=rows) > 0).astype(float)
    split = rows * 2 // 3
    return xgboost.DMatrix(X[:split], label=y[:split]), xgboost.DMatrix(X[split:], label=y[split:])


def _train(hook, dtrain, dval, rounds=7, params=PARAMS, **kwargs):
    evals_result: dict = {}
    booster = xgboost.train(params, dtrain, num_boost_round=rounds, evals=[(dtrain, "train"), (dval, "validation")],
                            evals_result=evals_result, callbacks=[hook] if hook else None, verbose_eval=False, **kwargs)
    return booster, evals_result


def test_metrics_importance_labels_predictions_equal_what_xgboost_reports(tmp_path):
    dtrain, dval = _data()
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=3), hyperparameters=PARAMS,
                   train_data=dtrain, validation_data=dval)
    booster, evals_result = _train(hook, dtrain, dval)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 3, 6] and trial.steps(ModeKeys.TRAIN) == [0, 3, 6] and trial.training_ended
    assert trial.tensor_names(collection="metrics") == ["train-logloss", "validation-logloss"]
    for step in trial.steps():
        for data in ("train", "validation"):
            saved = trial.tensor(f"{data}-logloss").value(step)
            assert saved.shape == () and saved.tolist() == evals_result[data]["logloss"][step]  # a scalar
        # labels and predictions of the validation data, with the model as of that round
        assert np.array_equal(trial.tensor("labels").value(step), dval.get_label())
        expected = booster[: step + 1].predict(dval)
        np.testing.assert_allclose(trial.tensor("predictions").value(step), expected, rtol=1e-6)
    # feature importance at the last round: XGBoost's get_score, normalised; unused features 0
    features = [f"f{i}" for i in range(6)]
    for importance_type in IMPORTANCE_TYPES:
        scores = booster.get_score(importance_type=importance_type)
        total = sum(scores.values())
        for feature in features:
            saved = trial.tensor(f"feature_importance/{importance_type}/{feature}").value(6)
            assert saved == pytest.approx(scores.get(feature, 0.0) / total, rel=1e-9)
    weight_names = [f"feature_importance/weight/{feature}" for feature in features]
    assert trial.tensor_names(regex=["^feature_importance/weight/"]) == weight_names
    # hyperparameters: round 0 only, numbers as numbers, strings as strings
    assert trial.tensor("hyperparameters/max_depth").steps() == [0]
    assert trial.tensor("hyperparameters/max_depth").value(0).tolist() == [3.0]
    assert trial.tensor("hyperparameters/objective").value(0).tolist() == ["binary:logistic"]
    # SHAP is opt-in
    assert not trial.tensor_names(regex=["shap"])


def test_trees_equal_trees_to_dataframe(tmp_path):
    pandas = pytest.importorskip("pandas")  # only the comparison needs it; the hook does not
    dtrain, dval = _data(1)
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=3), train_data=dtrain)
    booster, _ = _train(hook, dtrain, dval)
    trial = create_trial(str(tmp_path / "run"))
    columns = {}
    for name in ("Tree", "Node", "Depth", "Yes", "No", "Missing", "Split", "Gain", "Cover", "Feature"):
        # each saved round holds the trees added since the previous saved round
        columns[name] = np.concatenate([trial.tensor(f"trees/{name}").value(step) for step in trial.steps()])
    saved_trees = sorted(set(columns["Tree"].tolist()))
    assert saved_trees == [0, 1, 2, 3, 4, 5, 6]  # rounds 0, 1-3, 4-6
    frame = booster.trees_to_dataframe().sort_values(["Tree", "Node"]).reset_index(drop=True)
    order = np.lexsort((columns["Node"], columns["Tree"]))
    assert np.array_equal(columns["Tree"][order], frame["Tree"].to_numpy())
    assert np.array_equal(columns["Node"][order], frame["Node"].to_numpy())
    leaf = frame["Feature"].to_numpy() == "Leaf"
    for name in ("Yes", "No", "Missing"):
        expected = np.array([-1 if pandas.isna(v) else int(str(v).split("-")[1]) for v in frame[name]])
        assert np.array_equal(columns[name][order], expected)
    np.testing.assert_allclose(columns["Split"][order][~leaf], frame["Split"].to_numpy(dtype=float)[~leaf], rtol=1e-6)
    np.testing.assert_allclose(columns["Gain"][order], frame["Gain"].to_numpy(dtype=float), rtol=1e-5)
    np.testing.assert_allclose(columns["Cover"][order], frame["Cover"].to_numpy(dtype=float), rtol=1e-5)
    assert columns["Feature"][order].tolist() == frame["Feature"].tolist()
    assert columns["Depth"].max() == 3


def test_shap_only_when_asked_and_equal_to_pred_contribs(tmp_path):
    dtrain, dval = _data(2)
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=2), train_data=dtrain,
                   include_collections=["metrics", "average_shap", "full_shap"])
    booster, _ = _train(hook, dtrain, dval, rounds=5)
    trial = create_trial(str(tmp_path / "run"))
    contributions = booster.predict(dtrain, pred_contribs=True)
    names = [f"f{i}" for i in range(6)] + ["bias"]
    assert trial.tensor_names(collection="average_shap") == sorted(f"average_shap/{n}" for n in names)
    for index, name in enumerate(names):
        np.testing.assert_allclose(trial.tensor(f"full_shap/{name}").value(4), contributions[:, index], rtol=1e-6)
        assert trial.tensor(f"average_shap/{name}").value(4)[0] == pytest.approx(
            float(np.mean(np.abs(contributions[:, index]))), rel=1e-6)
    assert not trial.tensor_names(regex=["^trees/", "^feature_importance/", "^labels$"])  # not included


def test_hyperparameters_default_to_the_boosters_configuration(tmp_path):
    dtrain, dval = _data(3)
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1))
    _train(hook, dtrain, dval, rounds=2, params={**PARAMS, "max_depth": 4, "eta": 0.1})
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("hyperparameters/max_depth").value(0).tolist() == [4.0]
    assert trial.tensor("hyperparameters/eta").value(0) == pytest.approx([0.1])
    assert trial.tensor("hyperparameters/objective").value(0).tolist() == ["binary:logistic"]
    assert not trial.tensor_names(regex=["^labels$", "^predictions$"])  # no data given: nothing to predict


def test_multiclass_predictions_feed_class_imbalance(tmp_path):
    rng = np.random.default_rng(4)
    y = rng.choice(3, size=400, p=[0.9, 0.08, 0.02]).astype(float)  # class 2 is 45x rarer than class 0
    X = rng.normal(size=(400, 4)) + y[:, None]
    dtrain = xgboost.DMatrix(X, label=y)
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1), train_data=dtrain)
    params = {"objective": "multi:softprob", "num_class": 3, "max_depth": 2, "nthread": 1}
    booster = xgboost.train(params, dtrain, num_boost_round=3, callbacks=[hook])
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("predictions").value(2).shape == (400, 3)
    np.testing.assert_allclose(trial.tensor("predictions").value(2), booster.predict(dtrain), rtol=1e-6)
    results = evaluate_rule(trial, "ClassImbalance:samples=400")
    assert first_firing(results) == 0 and results[0].details["imbalance_ratio"] > 10


def test_a_failing_hook_never_breaks_training(tmp_path, caplog):
    dtrain, dval = _data(5)
    wrong_shape = xgboost.DMatrix(np.zeros((10, 9)), label=np.zeros(10))  # more features: predict() raises
    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1), validation_data=wrong_shape)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        booster, evals_result = _train(hook, dtrain, dval, rounds=4)
    reference, reference_result = _train(None, dtrain, dval, rounds=4)
    assert evals_result == reference_result
    assert np.array_equal(booster.predict(dval), reference.predict(dval))
    assert not hook.enabled and "capture disabled" in caplog.text and "training continues" in caplog.text


def test_continued_training_saves_only_the_new_trees_and_live_reads(tmp_path):
    dtrain, dval = _data(6)
    first, _ = _train(None, dtrain, dval, rounds=3)
    seen_live: list[list[int]] = []

    class ReadWhileTraining(xgboost.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            if epoch == 3:  # the run is live: no end marker yet
                trial = create_trial(str(tmp_path / "run"))
                trial.wait_for_steps([1], timeout=30)
                seen_live.append(trial.steps())
                assert not trial.training_ended
            return False

    hook = tg.Hook(str(tmp_path / "run"), save_config=tg.SaveConfig(save_interval=1))
    xgboost.train(PARAMS, dtrain, num_boost_round=4, xgb_model=first, callbacks=[hook, ReadWhileTraining()])
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor("trees/Tree").value(0).min() == 3  # trees 0-2 came from the earlier model
    assert sorted({int(t) for s in trial.steps() for t in trial.tensor("trees/Tree").value(s)}) == [3, 4, 5, 6]
    assert seen_live and seen_live[0][:2] == [0, 1]


def test_json_config_and_arguments(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"save_interval": "4"},
        "CollectionConfigurations": [
            {"CollectionName": "feature_importance", "CollectionParameters": {"save_interval": "2"}},
            {"CollectionName": "metrics"},
        ],
    }))
    dtrain, dval = _data(7)
    hook = tg.Hook.create_from_json_file(str(config), train_data=dtrain)
    assert {"trees", "labels", "predictions", "feature_importance", "metrics"} <= set(hook.include_collections)
    assert "weights" not in hook.include_collections
    _train(hook, dtrain, dval, rounds=5)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("feature_importance/weight/f0").steps() == [0, 2, 4]
    assert trial.tensor("train-logloss").steps() == [0, 4]
    assert trial.tensor("hyperparameters/max_depth").steps() == [0]
    # the scikit-learn API deep-copies callbacks: the copy is the hook itself
    assert copy.deepcopy(hook) is hook
    with pytest.raises(ConfigError, match="train_data"):
        tg.Hook(str(tmp_path / "bad"), train_data=np.zeros((3, 3)))
    with pytest.raises(ConfigError, match="gradients"):
        tg.Hook(str(tmp_path / "bad"), include_collections=["gradients"])


def test_runs_with_metrics_of_shape_1_are_read_as_before(tmp_path, monkeypatch):
    """Runs written before metrics became scalars hold them with shape (1,): the loss rules judge
    both the same way."""
    from trainguard.hooks.xgboost import XGBoostHook

    dtrain, dval = _data(rows=600)
    params = {**PARAMS, "max_depth": 8, "eta": 0.5}  # the validation logloss bottoms out, then rises
    scalar = tg.Hook(str(tmp_path / "scalar"), save_config=tg.SaveConfig(save_interval=1))
    _train(scalar, dtrain, dval, rounds=30, params=params)
    save = XGBoostHook._save

    def old_save(self, name, value, collection):  # the old writer: a 0-d value reshaped to (1,)
        array = np.asarray(value)
        save(self, name, array.reshape(1) if array.ndim == 0 else array, collection)

    monkeypatch.setattr(XGBoostHook, "_save", old_save)
    old = tg.Hook(str(tmp_path / "old"), save_config=tg.SaveConfig(save_interval=1))
    _train(old, dtrain, dval, rounds=30, params=params)
    assert create_trial(str(tmp_path / "old")).tensor("validation-logloss").value(3).shape == (1,)
    assert create_trial(str(tmp_path / "scalar")).tensor("validation-logloss").value(3).shape == ()
    for spec in ("Overtraining:patience_validation=5", "LossNotDecreasing:num_steps=4,semantics=sagemaker"):
        on_old = [(r.step, r.fired, r.message) for r in evaluate_rule(str(tmp_path / "old"), spec)]
        on_scalar = [(r.step, r.fired, r.message) for r in evaluate_rule(str(tmp_path / "scalar"), spec)]
        assert on_old == on_scalar and any(fired for _, fired, _ in on_old), spec
