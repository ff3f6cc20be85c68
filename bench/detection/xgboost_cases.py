"""XGBoost cases: healthy boosters (validation, early stopping, shallow and default-depth trees)
and two fault classes the XGBoost rules exist for: trees grown without a depth limit on noisy
labels, and a feature that leaks the label (one feature carries nearly all the importance)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import xgboost  # noqa: F401 - ImportError here leaves the XGBoost cases out

from bench.detection.harness import METRICS_FILE
from bench.detection.registry import FAULTY, HEALTHY, Case


@dataclass(frozen=True)
class BoostSpec:
    objective: str = "binary:logistic"
    max_depth: int = 4
    rounds: int = 30
    eta: float = 0.3
    seed: int = 0
    save_interval: int = 1
    early_stopping: int = 0
    fault: str = "none"  # none | unlimited_depth | leaked_label


def _data(spec: BoostSpec, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + spec.seed)
    x = rng.normal(size=(rows, 8))
    signal = x[:, 0] - 0.8 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3]
    if spec.objective.startswith("reg"):
        y = signal + 0.3 * rng.normal(size=rows)
    elif spec.objective.startswith("multi"):
        y = np.digitize(signal + 0.3 * rng.normal(size=rows), [-0.7, 0.7]).astype(float)
    else:
        y = (signal + 0.5 * rng.normal(size=rows) > 0).astype(float)
    if spec.fault == "unlimited_depth":  # labels mostly noise: unconstrained trees memorise them
        y = rng.permutation(y)
    if spec.fault == "leaked_label":  # a column computed from the target (e.g. joined after the fact)
        x[:, 5] = y + 0.01 * rng.normal(size=rows)
    return x, y


def train_xgboost(out_dir: str, spec: BoostSpec) -> str:

    import trainguard.xgboost as tg

    x, y = _data(spec, 600)
    dtrain = xgboost.DMatrix(x[:400], label=y[:400])
    dval = xgboost.DMatrix(x[400:], label=y[400:])
    params = {"objective": spec.objective, "max_depth": spec.max_depth, "eta": spec.eta, "nthread": 1,
              "seed": spec.seed}  # fmt: skip
    if spec.objective.startswith("multi"):
        params["num_class"] = 3
    if spec.fault == "unlimited_depth":
        params.update(max_depth=0 if spec.max_depth == 0 else 100, min_child_weight=0, reg_lambda=0)
    hook = tg.Hook(out_dir, save_config=tg.SaveConfig(save_interval=spec.save_interval), train_data=dtrain,
                   validation_data=dval)  # fmt: skip
    evals_result: dict = {}
    evals = [(dtrain, "train"), (dval, "validation")]
    booster = xgboost.train(params, dtrain, num_boost_round=spec.rounds, evals=evals,
                            callbacks=[hook], evals_result=evals_result, verbose_eval=False,
                            early_stopping_rounds=spec.early_stopping or None)  # fmt: skip
    hook.close()  # after_training closes too; closing twice is harmless
    validation = next(iter(evals_result["validation"].values()))
    depth = max(_depth(json.loads(dump)) for dump in booster.get_dump(dump_format="json"))
    gains = booster.get_score(importance_type="weight")
    share = max(gains.values()) / sum(gains.values()) if gains else 0.0
    if spec.fault == "unlimited_depth":
        ok, seen = depth > 8, f"tree depth {depth}"
    elif spec.fault == "leaked_label":
        ok, seen = gains.get("f5", 0) == max(gains.values()), f"top feature share {share:.2f} (f5 leaks the label)"
    else:
        ok = validation[-1] < validation[0]
        seen = f"validation {validation[0]:.3g} -> {validation[-1]:.3g}, depth {depth}"
    metrics = {"spec": spec.__dict__, "losses": validation, "symptom_checked": ok, "symptom_text": seen}
    with open(os.path.join(out_dir, METRICS_FILE), "w", encoding="utf-8") as file:
        json.dump(metrics, file)
    return out_dir


def _depth(node: dict, depth: int = 0) -> int:
    return max((_depth(child, depth + 1) for child in node.get("children") or []), default=depth)


def xgboost_cases() -> list[Case]:
    B = BoostSpec

    def healthy(name: str, spec: BoostSpec, description: str) -> Case:
        return Case(f"healthy-xgb-{name}", "xgboost", HEALTHY, train_xgboost, spec, (), 0, "learns", description)

    def faulty(name: str, spec: BoostSpec, expected: tuple[str, ...], description: str) -> Case:
        return Case(f"fault-xgb-{name}", "xgboost", FAULTY, train_xgboost, spec, expected, 0, "learns", description)

    return [
        healthy("binary-early-stopping", B(early_stopping=5, rounds=60), "binary, depth 4, early stopping"),
        healthy("regression-default-depth", B(objective="reg:squarederror", max_depth=6, seed=1),
                "regression, XGBoost's default depth 6"),  # fmt: skip
        healthy("multiclass", B(objective="multi:softprob", seed=2, save_interval=2), "3 classes, depth 4"),
        healthy("shallow-many-rounds", B(max_depth=2, eta=0.1, rounds=80, seed=3, save_interval=5), "depth 2"),
        faulty("unlimited-depth-noise", B(fault="unlimited_depth", rounds=5), ("TreeDepth",),
               "noisy labels, max_depth 100, no regularisation"),  # fmt: skip
        faulty("unlimited-depth-regression", B(objective="reg:squarederror", fault="unlimited_depth", rounds=5,
                                               seed=1), ("TreeDepth",),
               "regression on noise, max_depth 100"),  # fmt: skip
        faulty("leaked-label", B(fault="leaked_label", seed=2), ("FeatureImportanceOverweight",),
               "feature 5 = label + noise"),  # fmt: skip
        faulty("leaked-label-multiclass", B(objective="multi:softprob", fault="leaked_label", seed=3),
               ("FeatureImportanceOverweight",), "3 classes, feature 5 = label"),  # fmt: skip
    ]
