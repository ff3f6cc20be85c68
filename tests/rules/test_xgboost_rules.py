"""TreeDepth and FeatureImportanceOverweight on real XGBoost training captured by trainguard's
hook, plus numpy oracles on synthetic runs (including smdebug-style runs with node ids only)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.rules.synthetic import evaluate_rule, first_firing, write_run
from trainguard.errors import ConfigError
from trainguard.rules import RuleSpec, create_rule
from trainguard.rules.builtin.tree_depth import depth_from_links, depth_from_node_ids

xgboost = pytest.importorskip("xgboost")
import trainguard.xgboost as tg  # noqa: E402 - needs xgboost


def _train(tmp_path, X, y, params, rounds, *, interval=1, name="run"):
    out = tmp_path / name
    dtrain = xgboost.DMatrix(X, label=y)
    hook = tg.Hook(str(out), save_config=tg.SaveConfig(save_interval=interval), train_data=dtrain)
    # one thread: on a small shared machine xgboost's thread start-up costs seconds per deep tree
    booster = xgboost.train({"nthread": 1, **params}, dtrain, num_boost_round=rounds, callbacks=[hook],
                            verbose_eval=False)
    return str(out), booster


def _true_depth(booster) -> int:
    """Depth from XGBoost's own dump, independent of the hook: the deepest node's nesting."""
    def walk(node, depth):
        children = node.get("children") or []
        return max([walk(child, depth + 1) for child in children], default=depth)

    import json

    return max(walk(json.loads(dump), 0) for dump in booster.get_dump(dump_format="json"))


# -- TreeDepth on real training --------------------------------------------------------------------


def test_tree_depth_fires_on_deep_trees_and_is_silent_on_shallow_ones(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = rng.integers(0, 2, 300).astype(float)  # noise labels: unconstrained trees grow until leaves are pure
    deep, booster = _train(tmp_path, X, y, {"objective": "binary:logistic", "max_depth": 100, "min_child_weight": 0,
                                            "lambda": 0}, rounds=2, name="deep")
    results = evaluate_rule(deep, "TreeDepth")
    assert first_firing(results) == 0
    assert max(result.details["max_depth"] for result in results) == _true_depth(booster) > 6
    assert "max_depth" in results[0].fix_hint
    shallow, booster = _train(tmp_path, X, y, {"objective": "binary:logistic", "max_depth": 3}, rounds=4,
                              name="shallow")
    results = evaluate_rule(shallow, "TreeDepth")
    assert results and first_firing(results) is None
    assert max(result.details["max_depth"] for result in results) == _true_depth(booster) == 3


def test_tree_depth_documented_default_fires_on_xgboost_default_depth(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 6))
    y = np.sin(3 * X[:, 0]) * X[:, 1] + 0.3 * rng.normal(size=400)
    run, booster = _train(tmp_path, X, y, {"objective": "reg:squarederror"}, rounds=3)  # max_depth 6 (xgboost default)
    assert _true_depth(booster) == 6
    assert first_firing(evaluate_rule(run, "TreeDepth:depth=4")) == 0  # SageMaker's default
    assert first_firing(evaluate_rule(run, "TreeDepth")) is None  # calibrated: 6


# -- FeatureImportanceOverweight on real training -----------------------------------------------------


def test_feature_importance_overweight_dominant_feature_fires_balanced_silent(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 10))
    dominant = 3 * np.sin(2 * X[:, 0]) + 0.01 * rng.normal(size=500)
    run, _ = _train(tmp_path, X, dominant, {"objective": "reg:squarederror", "max_depth": 3}, rounds=21,
                    interval=5, name="dominant")
    results = evaluate_rule(run, "FeatureImportanceOverweight")
    fired = [result for result in results if result.fired]
    assert fired and fired[0].step == 10  # the first judged round
    assert "feature_importance/weight/f0" in fired[0].details["top"] and "leakage" in fired[0].fix_hint
    balanced = X @ rng.uniform(0.8, 1.2, 10)
    run, _ = _train(tmp_path, X, balanced, {"objective": "reg:squarederror", "max_depth": 2}, rounds=21,
                    interval=5, name="balanced")
    results = evaluate_rule(run, "FeatureImportanceOverweight")
    assert len(results) == 3 and first_firing(results) is None  # rounds 10, 15, 20
    # SageMaker's every-step reading fires at round 0: one depth-2 tree has 3 splits
    assert first_firing(evaluate_rule(run, "FeatureImportanceOverweight:semantics=sagemaker")) == 0
    # the signal lives in two columns: a model leaning on both is healthy (the top 3 hold > 80 %
    # of the importance, so SageMaker's sum fires; no single feature does)
    two = X[:, 0] - 0.8 * X[:, 1] + 0.1 * rng.normal(size=500)
    run, _ = _train(tmp_path, X, two, {"objective": "reg:squarederror", "max_depth": 2}, rounds=41,
                    interval=10, name="two-columns")
    results = evaluate_rule(run, "FeatureImportanceOverweight")
    assert [r.step for r in results] == [10, 20, 30, 40] and first_firing(results) is None
    assert max(r.details["dominant_share"] for r in results) < 0.8 < max(r.details["share"] for r in results)
    assert first_firing(evaluate_rule(run, "FeatureImportanceOverweight:semantics=sagemaker")) is not None


# -- synthetic runs: oracles, smdebug-style tensors, parameters ---------------------------------------


def _random_tree(rng, max_depth):
    """A random binary tree in XGBoost's creation-order numbering: (node, yes, no, depth) rows."""
    rows, frontier, next_id = [], [(0, 0)], 1
    while frontier:
        node, depth = frontier.pop(0)
        if depth < max_depth and rng.random() < 0.7:
            rows.append((node, next_id, next_id + 1, depth))
            frontier += [(next_id, depth + 1), (next_id + 1, depth + 1)]
            next_id += 2
        else:
            rows.append((node, -1, -1, depth))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_tree_depth_from_links_matches_oracle(tmp_path, seed):
    rng = np.random.default_rng(seed)
    steps, expected_depths = {}, []
    for step in range(4):
        columns = {"Tree": [], "Node": [], "Yes": [], "No": []}
        depths = []
        for tree in range(int(rng.integers(1, 4))):
            for node, yes, no, depth in _random_tree(rng, int(rng.integers(1, 10))):
                for key, value in zip(("Tree", "Node", "Yes", "No"), (tree, node, yes, no), strict=True):
                    columns[key].append(value)
                depths.append(depth)
        order = rng.permutation(len(depths))  # row order must not matter
        steps[step] = {f"trees/{key}": np.asarray(values)[order] for key, values in columns.items()}
        expected_depths.append(max(depths))
    run = write_run(tmp_path / "run", steps, collections={"trees": list(steps[0])})
    limit = int(rng.integers(1, 8))
    results = evaluate_rule(run, RuleSpec("TreeDepth", {"depth": str(limit)}))
    assert [result.details["max_depth"] for result in results] == expected_depths
    assert all(result.details["method"] == "tree links" for result in results)
    assert first_firing(results) == next((s for s, d in enumerate(expected_depths) if d > limit), None)


def test_tree_depth_smdebug_style_node_ids_only_is_a_lower_bound_exact_for_full_trees(tmp_path):
    for depth in range(6):
        full = np.arange(2 ** (depth + 1) - 1)
        assert depth_from_node_ids(full.astype(float)) == depth
    # SageMaker's plain log2(max id) calls a full depth-4 tree 4.9 deep
    assert math.log2(2**5 - 2) > 4
    rng = np.random.default_rng(3)
    for _ in range(20):
        rows = _random_tree(rng, 8)
        nodes = np.array([row[0] for row in rows], dtype=float)
        assert depth_from_node_ids(nodes) <= max(row[3] for row in rows)
        links = depth_from_links(np.zeros(len(rows)), nodes, np.array([r[1] for r in rows], float),
                                 np.array([r[2] for r in rows], float))
        assert links == max(row[3] for row in rows)
    run = write_run(tmp_path / "run", {0: {"trees/Node": np.arange(63), "trees/ID": np.array(["0-0"] * 63)}})
    result = evaluate_rule(run, "TreeDepth:depth=4")[0]
    assert result.fired and result.details == {"max_depth": 5, "method": "estimated from the largest node id",
                                               "depth": 4}


@pytest.mark.parametrize("semantics", ["calibrated", "sagemaker"])
@pytest.mark.parametrize("seed", range(6))
def test_feature_importance_overweight_matches_oracle(tmp_path, seed, semantics):
    """Calibrated: the one largest share from round 10; SageMaker: the top-nfeatures sum from round 0."""
    rng = np.random.default_rng(seed)
    features = int(rng.integers(2, 12))
    nfeatures, threshold = int(rng.integers(1, 5)), float(rng.choice([0.5, 0.8, 0.95]))
    steps, expected = {}, None
    for step in range(0, 30, 5):
        raw = rng.dirichlet(np.full(features, float(rng.choice([0.2, 5.0])))) * float(rng.uniform(0.5, 3))
        steps[step] = {f"feature_importance/weight/f{i}": value for i, value in enumerate(raw)}
        steps[step]["feature_importance/gain/f0"] = 1.0  # another type: not selected by the default regex
        ranked = np.sort(raw / raw.sum())[::-1]
        share = ranked[:nfeatures].sum() if semantics == "sagemaker" else ranked[0]
        first = 0 if semantics == "sagemaker" else 10
        if expected is None and step >= first and features > nfeatures and share > threshold:
            expected = step
    run = write_run(tmp_path / "run", steps)
    spec = RuleSpec("FeatureImportanceOverweight", {"nfeatures": str(nfeatures), "threshold": str(threshold),
                                                    "semantics": semantics})  # fmt: skip
    assert first_firing(evaluate_rule(run, spec)) == expected


def test_xgboost_rule_parameters_and_missing_tensors(tmp_path):
    run = write_run(tmp_path / "run", {0: {"train-rmse": 1.0}})
    from tests.rules.synthetic import open_trial

    trial = open_trial(run)
    assert create_rule(trial, RuleSpec("TreeDepth", {"depth": "10"})).depth == 10
    rule = create_rule(trial, RuleSpec("FeatureImportanceOverweight", {"threshold": "0.5", "nfeatures": "2",
                                                                       "tensor_regex": ".*feature_importance/gain"}))
    assert (rule.threshold, rule.nfeatures, rule.tensor_regex) == (0.5, 2, ".*feature_importance/gain")
    with pytest.raises(ConfigError, match="threshold"):
        create_rule(trial, RuleSpec("FeatureImportanceOverweight", {"threshold": "1.5"}))
    with pytest.raises(ConfigError, match="depth"):
        create_rule(trial, RuleSpec("TreeDepth", {"depth": "deep"}))
    assert evaluate_rule(run, "TreeDepth")[0].missing[0].collection == "trees"
    assert evaluate_rule(run, "FeatureImportanceOverweight")[0].missing[0].collection == "feature_importance"


# -- the loss rules on XGBoost runs: metrics where lower is better are the losses -------------------


def _train_with_validation(tmp_path, params, rounds, *, name, seed=0, noise=1.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(400, 5))
    y = (X[:, 0] + noise * rng.normal(size=400) > 0).astype(float)
    dtrain, dval = xgboost.DMatrix(X[:300], label=y[:300]), xgboost.DMatrix(X[300:], label=y[300:])
    out = str(tmp_path / name)
    hook = tg.Hook(out, save_config=tg.SaveConfig(save_interval=2), train_data=dtrain, validation_data=dval)
    evals_result: dict = {}
    xgboost.train({"nthread": 1, "objective": "binary:logistic", "eval_metric": ["auc", "logloss"], **params}, dtrain,
                  num_boost_round=rounds, evals=[(dtrain, "train"), (dval, "validation")], evals_result=evals_result,
                  callbacks=[hook], verbose_eval=False)
    return out, evals_result


def test_loss_rules_use_xgboost_validation_metrics(tmp_path):
    # deep trees on noisy labels: the validation logloss bottoms out early, then rises
    over, result = _train_with_validation(tmp_path, {"max_depth": 8, "eta": 0.5}, 40, name="over")
    validation = result["validation"]["logloss"]
    best_round = int(np.argmin(validation))
    assert validation[-1] > validation[best_round]
    results = evaluate_rule(over, "Overtraining:patience_validation=5")
    fired = next(r for r in results if r.fired)
    assert "validation loss" in fired.message and fired.step > best_round
    lnd = evaluate_rule(over, "LossNotDecreasing:num_steps=4,semantics=sagemaker")  # the single-step condition
    assert first_firing(lnd) is not None
    assert all(set(r.details["losses"]) == {"validation-logloss"} for r in lnd)  # auc is not a loss
    overfit = evaluate_rule(over, "Overfit")
    # Overfit cannot judge a boosted run: "not evaluated" (RuleNotEvaluated), pointing to Overtraining
    assert not any(r.fired for r in overfit) and overfit[-1].not_evaluated and "Overtraining" in overfit[-1].message
    # the over-fitted model's validation predictions: 19 of its 54 class-0 predictions (35 %) are class
    # 1, where the labels' own noise makes ~25 % unavoidable. Not surely above max_off_diag 0.3 (99 %
    # interval 21-53 %): calibrated semantics stay silent; judging the share itself (SageMaker's
    # condition, same thresholds) fires from round 10
    assert first_firing(evaluate_rule(over, "Confusion")) is None
    documented = "Confusion:semantics=sagemaker,min_diag=0.5,max_off_diag=0.3,start_step=10,samples=500"
    assert first_firing(evaluate_rule(over, documented)) == 10
    # a gentle run keeps improving its validation loss: silent
    gentle, result = _train_with_validation(tmp_path, {"max_depth": 2, "eta": 0.05}, 40, name="gentle", noise=0.3)
    assert np.all(np.diff(result["validation"]["logloss"]) < 0)
    assert first_firing(evaluate_rule(gentle, "Overtraining:patience_validation=5")) is None
    assert first_firing(evaluate_rule(gentle, "LossNotDecreasing:num_steps=4")) is None
    assert first_firing(evaluate_rule(gentle, "Underfitting:warmup_steps=10")) is None
    assert first_firing(evaluate_rule(gentle, "Confusion")) is None
    assert first_firing(evaluate_rule(gentle, "ClassImbalance:samples=100")) is None
    # a learning rate far too small: the training logloss stays at its start
    stuck, _ = _train_with_validation(tmp_path, {"max_depth": 2, "eta": 0.0005}, 30, name="stuck")
    results = evaluate_rule(stuck, "Underfitting:warmup_steps=10,semantics=sagemaker")  # single-step condition
    assert first_firing(results) == 10 and results[0].details["mode"] == "TRAIN"
