"""FeatureImportanceOverweight: a few features carry most of an XGBoost model's importance.

Formula, at each step with tensors matching ``tensor_regex`` (``feature_importance/weight/<f>``,
one scalar per feature):

    w_f = importance_f / Σ_g importance_g          (normalised again: smdebug runs may not be)
    fire if Σ of the nfeatures largest w_f > threshold

The rule does not judge a run with ``nfeatures`` features or fewer in total (names seen over
the whole run): their top ``nfeatures`` always sum to 1, so SageMaker's rule fires on every
such model. trainguard's XGBoost hook saves every feature, unused ones as 0, so a model that
uses 2 of 20 features is still judged (and fires).

Calibrated semantics (default) judge the single most important feature: fire when it alone holds
more than ``threshold`` of the importance (the top ``nfeatures`` are still reported). A sum over
the top 3 calls every model of a data set whose signal lives in 2 or 3 columns "overweight" (a
depth-2 booster on two informative features holds 92 % in its top 3 after 40 rounds and is
healthy); a leaked label shows as one column doing nearly all the work (95-100 % here). The
documented top-``nfeatures`` sum, judged from round 0, is ``semantics="sagemaker"``.

Calibrated default: ``start_step`` (trainguard only) 10: rounds before it are not judged
(SageMaker: every step). After one round a depth-2 tree has 3 splits, so with ``weight``
importance the top 3 features hold 100 % of it whatever the data; by round 10 the model has
dozens of splits and a balanced data set shows as balanced. The documented parameters keep
their documented defaults.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainguard.rules.base import MissingTensor, Rule, StepResult
from trainguard.rules.builtin._losses import fmt, is_complete, read_values
from trainguard.rules.params import SAGEMAKER, Param, semantics_param


class FeatureImportanceOverweight(Rule):
    """The model leans on a handful of features (leakage, or features that carry no signal)."""

    rule_name = "FeatureImportanceOverweight"
    collections = ("feature_importance",)
    frameworks = ("xgboost",)  # the collections exist only in XGBoost captures
    fix_hint = (
        "check the dominant features for target leakage (a column computed from the label, an id or a "
        "timestamp); drop or regularise them (colsample_bytree, feature_weights), and check why the other "
        "features carry no signal"
    )

    threshold = Param(float, 0.8, "fire when the top nfeatures hold more than this share of the importance",
                      check=lambda value: None if 0 < value <= 1 else "must be in (0, 1]")
    nfeatures = Param(int, 3, "how many of the largest importances are summed",
                      check=lambda value: None if value > 0 else "must be > 0")
    tensor_regex = Param("regex", ".*feature_importance/weight", "regex of the importance tensors")
    start_step = Param(int, 10, "first step (boosting round) judged", documented_default=0,
                       check=lambda value: None if value >= 0 else "must be >= 0")
    semantics = semantics_param()

    def __init__(self, *args, **parameters) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **parameters)
        if self.semantics == SAGEMAKER and "start_step" not in parameters:
            self.__dict__["start_step"] = 0  # SageMaker judges every round

    def check(self, step: int) -> StepResult | None:
        trial = self.base_trial
        if not is_complete(trial, step):
            return None
        names = trial.tensor_names(step=step, regex=[self.tensor_regex])
        if not names:
            if trial.training_ended and not trial.tensor_names(regex=[self.tensor_regex]):
                framework = self.framework()
                if framework not in (None, "xgboost"):  # in a default set beside a PyTorch/Keras run
                    return self.not_applicable(f"applies to XGBoost models only; this is a {framework} run", step)
                return self.missing(step, MissingTensor(f"feature importances matching {self.tensor_regex!r}",
                                                        "feature_importance"))
            return None
        if step < self.start_step:
            return None
        importances: dict[str, float] = {}
        for name, value in read_values(trial, names, step).items():
            array = np.asarray(value)
            if array.dtype.kind in "fiub" and array.size:
                number = float(np.sum(array.astype(np.float64)))
                if np.isfinite(number) and number >= 0:
                    importances[name] = number
        features_in_run = len(trial.tensor_names(regex=[self.tensor_regex]))
        total = sum(importances.values())
        if not importances or total <= 0:
            return None
        if features_in_run <= self.nfeatures:
            return self.no_issue(step, f"only {features_in_run} feature(s): the top {self.nfeatures} always hold all "
                                 "the importance", features=features_in_run)
        ranked = sorted(((value / total, name) for name, value in importances.items()), reverse=True)
        top = ranked[: self.nfeatures]
        share = sum(weight for weight, _ in top)
        details: dict[str, Any] = {
            "top": {name: weight for weight, name in top},
            "share": share,
            "features": features_in_run,
            "dominant_share": top[0][0],
        }
        listed = ", ".join(f"{name.rsplit('/', 1)[-1]} ({fmt(100 * weight)} %)" for weight, name in top)
        if self.semantics == SAGEMAKER:
            if share > self.threshold:
                return self.issue(
                    step,
                    f"the top {len(top)} features hold {fmt(100 * share)} % of the importance "
                    f"(threshold {fmt(100 * self.threshold)} %): {listed}",
                    **details,
                )
        elif top[0][0] > self.threshold:
            return self.issue(
                step,
                f"one feature, {top[0][1].rsplit('/', 1)[-1]}, holds {fmt(100 * top[0][0])} % of the importance "
                f"(threshold {fmt(100 * self.threshold)} %): the model leans on it alone; top {len(top)}: {listed}",
                **details,
            )
        return self.no_issue(step, **details)
