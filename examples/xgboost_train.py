"""XGBoost training captured with trainguard's hook, then checked with the XGBoost rules.

    python examples/xgboost_train.py --out trainguard-runs/xgb               # healthy: no findings
    python examples/xgboost_train.py --out trainguard-runs/xgb-deep --max-depth 30
    python examples/xgboost_train.py --out trainguard-runs/xgb-leak --leak

``--max-depth 30`` lets trees grow deep (TreeDepth fires; the over-fitted model's validation
predictions then confuse the classes: Confusion); ``--leak`` adds a feature computed from the
label (FeatureImportanceOverweight fires). The hook is an ``xgboost.callback``: pass
it in ``callbacks=[hook]``; one boosting round is one step.
"""

from __future__ import annotations

import argparse

import numpy as np
import xgboost

import trainguard.xgboost as tg
from trainguard.rules import create_rule
from trainguard.trial import create_trial

RULES = ["TreeDepth", "FeatureImportanceOverweight", "ClassImbalance", "Confusion"]


def synthetic_data(rows: int, leak: bool, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Ten informative features; with ``leak``, an extra column that is the label plus noise."""
    X = rng.normal(size=(rows, 10))
    score = X @ rng.uniform(0.5, 1.5, 10) + rng.normal(scale=2.0, size=rows)
    y = (score > 0).astype(float)
    if leak:
        X = np.column_stack([X, y + 0.01 * rng.normal(size=rows)])
    return X, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="trainguard-runs/xgboost")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--leak", action="store_true", help="add a feature computed from the label")
    parser.add_argument("--save-interval", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    X, y = synthetic_data(2000, args.leak, rng)
    dtrain = xgboost.DMatrix(X[:1500], label=y[:1500])
    dval = xgboost.DMatrix(X[1500:], label=y[1500:])
    params = {"objective": "binary:logistic", "max_depth": args.max_depth, "eta": 0.2, "eval_metric": "logloss"}
    if args.max_depth > 10:
        params.update(min_child_weight=0, reg_lambda=0)  # let the deep trees actually grow

    hook = tg.Hook(
        out_dir=args.out,
        save_config=tg.SaveConfig(save_interval=args.save_interval),
        hyperparameters=params,
        train_data=dtrain,
        validation_data=dval,
    )
    xgboost.train(params, dtrain, num_boost_round=args.rounds, evals=[(dtrain, "train"), (dval, "validation")],
                  callbacks=[hook], verbose_eval=10)

    trial = create_trial(args.out)
    print(f"\n{args.out}: steps {trial.steps()[:5]}... metrics {trial.tensor_names(collection='metrics')}")
    for spec in RULES:
        rule = create_rule(trial, spec)
        findings = [result for step in trial.steps() if (result := rule.evaluate(step)) is not None and result.fired]
        if findings:
            first = findings[0]
            print(f"{rule.name()}: fired at step {first.step}: {first.message}\n    fix: {first.fix_hint}")
        else:
            print(f"{rule.name()}: no issues")


if __name__ == "__main__":
    main()
