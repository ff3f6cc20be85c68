"""``Rule.inapplicable``: "does not apply to this run" only from structured facts of the run
(its framework, collections configured yet empty), never for data that should be there."""

from __future__ import annotations

from typing import Any

from trainguard.rules.base import Rule
from trainguard.summary import is_not_applicable, render_rule_results


class _Trial:
    def __init__(self, framework: str, collections: dict[str, list[str]], steps: tuple[int, ...] = (0, 10)) -> None:
        self._framework, self._collections, self._steps = framework, collections, list(steps)

    def framework(self) -> str:
        return self._framework

    def steps(self) -> list[int]:
        return self._steps

    def collections(self) -> dict[str, Any]:
        return dict(self._collections)

    def tensor_names(self, collection: str | None = None, **_: Any) -> list[str]:
        return list(self._collections.get(collection or "", []))


class _TanhRule(Rule):
    collections = ("tanh_input", "sigmoid_input")
    reads_only_collections = True

    def check(self, step: int) -> None:
        return None


class _TreeRule(Rule):
    collections = ("trees",)
    frameworks = ("xgboost",)

    def check(self, step: int) -> None:
        return None


class _ByNameRule(Rule):  # reads a tensor by name: an empty collection says nothing about it
    collections = ("losses",)

    def check(self, step: int) -> None:
        return None


def test_framework_and_empty_configured_collections_are_not_applicable() -> None:
    pytorch = _Trial("pytorch", {"tanh_input": [], "sigmoid_input": [], "trees": [], "losses": []})
    assert _TreeRule(pytorch).inapplicable() == "applies to xgboost runs only; this is a pytorch run"
    assert "no tanh_input or sigmoid_input tensors" in str(_TanhRule(pytorch).inapplicable())
    assert _ByNameRule(pytorch).inapplicable() is None


def test_missing_or_present_data_is_not_inapplicable() -> None:
    # a collection never configured is missing data ("could not evaluate"), not the model's design
    assert _TanhRule(_Trial("pytorch", {"tanh_input": []})).inapplicable() is None
    # tanh inputs saved: the rule applies (it could not evaluate for another reason)
    assert _TanhRule(_Trial("pytorch", {"tanh_input": ["1_input_0"], "sigmoid_input": []})).inapplicable() is None
    # nothing saved at all says nothing about the model
    assert _TanhRule(_Trial("pytorch", {"tanh_input": [], "sigmoid_input": []}, steps=())).inapplicable() is None
    assert _TreeRule(_Trial("xgboost", {"trees": []})).inapplicable() is None


def test_summary_counts_not_applicable_in_one_line_and_keeps_could_not_evaluate() -> None:
    results = [
        {"configuration_name": "TreeDepth", "status": "Error", "status_details": "RuleNotEvaluated: applies to...",
         "not_applicable": True, "findings": []},
        {"configuration_name": "SaturatedActivation", "status": "Error",
         "status_details": "RuleNotEvaluated: the run has no tanh", "not_applicable": True, "findings": []},
        {"configuration_name": "LossNotDecreasing", "status": "Error",
         "status_details": "RuleNotEvaluated: 1 finite saved loss", "findings": []},
        {"configuration_name": "DeadRelu", "status": "NoIssuesFound", "status_details": "", "findings": []},
    ]  # fmt: skip
    assert [is_not_applicable(r) for r in results] == [True, True, False, False]
    text = render_rule_results(results)
    assert "  rules       : 4 run, 0 found issues, 2 not applicable, 1 not evaluated" in text
    assert "    2 rules not applicable to this run: TreeDepth, SaturatedActivation" in text
    assert "LossNotDecreasing  not evaluated (Error): 1 finite saved loss" in text
    assert "TreeDepth  not evaluated" not in text and "SaturatedActivation  not evaluated" not in text


class _WeightRule(Rule):  # a neural network's tensors
    collections = ("weights", "gradients")

    def check(self, step: int) -> None:
        return None


class _LabelRule(Rule):  # labels and predictions: an XGBoost run has them too
    collections = ("labels", "predictions")

    def check(self, step: int) -> None:
        return None


def test_neural_network_rules_do_not_apply_to_a_boosted_model() -> None:
    """An XGBoost run has no weights, gradients, activations or model inputs: a rule reading only
    those does not apply ("save the collection 'gradients'" is no advice for a booster); rules
    reading labels, predictions or losses (the evaluation metrics) still do."""
    xgboost_run = _Trial("xgboost", {"metrics": ["train-logloss"], "trees": ["trees/Depth"], "labels": ["labels"]})
    assert _WeightRule(xgboost_run).inapplicable() == (
        "reads weights, gradients, which a boosted model does not have; this is an xgboost run"
    )
    assert _LabelRule(xgboost_run).inapplicable() is None
    assert _ByNameRule(xgboost_run).inapplicable() is None  # the losses: XGBoost's metrics
    assert _WeightRule(_Trial("pytorch", {"weights": []})).inapplicable() is None


def test_what_rules_can_read_in_an_xgboost_run_covers_the_hooks_collections() -> None:
    import pytest

    pytest.importorskip("xgboost")
    from trainguard.hooks.xgboost import XGBOOST_COLLECTIONS
    from trainguard.rules.base import XGBOOST_RULE_COLLECTIONS

    assert set(XGBOOST_COLLECTIONS) - {"all", "default"} <= XGBOOST_RULE_COLLECTIONS
