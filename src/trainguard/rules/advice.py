"""Advice: a finding about the data or the initialisation, not about how the run learns.

A property of the input data (its scale, its images' mean, its label frequencies, its padding)
or of the initial weights is no fault by itself: plenty of healthy programs feed unnormalised
engineered features, images in [0, 1], imbalanced labels or a non-standard initialisation, and
train well. Reported as an issue, such a finding makes the tool cry wolf on the programs that
work, and put "normalise the data" first on programs whose bug is elsewhere. So these findings
are **advice**:

* a ``StepResult`` with ``advice=True`` (and ``certain=False``: advice never stops training);
* the rule's status stays NoIssuesFound (SageMaker's ``StatusDetails`` begins ``Advice:``), it
  raises no alarm, ``rules run`` does not exit with the "issues found" code, and it is never
  the primary finding of a diagnosis on its own;
* it becomes a finding, and a candidate cause, only when the run shows a learning symptom
  (:data:`LEARNING_SYMPTOMS`; see :func:`trainguard.rules.diagnosis.diagnose`): then it may
  explain those symptoms through the explanation graph.

Which findings advise: those of the rules in :data:`ADVISING_RULES`, unless the finding is of
another kind (ClassImbalance's "class N is mispredicted" is kind Misprediction, a symptom; NaN or
infinite values in the data are kind NonFinite) or certain (a rule sure enough to stop training
is not describing a mere property). A custom rule advises by setting the class attribute
``advises = True``; any rule may mark one result explicitly with ``self.issue(..., advice=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainguard.rules.kinds import MISPREDICTION, NON_FINITE, finding_kind

__all__ = [
    "ADVICE_PREFIX", "ADVISING_RULES", "LEARNING_SYMPTOMS", "advice_details", "advises_by_default", "is_advice",
    "rule_advises",
]  # fmt: skip

# SageMaker's StatusDetails of a rule whose findings are all advice (its status stays NoIssuesFound).
ADVICE_PREFIX = "Advice:"

# rule -> what its advice is about, for ``rules describe``.
ADVISING_RULES: Mapping[str, str] = {
    "NotNormalizedData": "the scale or centring of the model's input data",
    "CheckInputImages": "the mean of the input images",
    "ClassImbalance": "the label frequencies (its 'class N is mispredicted' finding is a symptom, not advice)",
    "NLPSequenceRatio": "the share of padding/unknown tokens in the input sequences",
    "PoorWeightInitialization": "the initial scale of the weights (a certain finding, identical weights, is an issue)",
    "TreeDepth": "the depth of the boosted trees",
    "FeatureImportanceOverweight": "how the feature importance is spread over the features",
}

# Kinds of finding that show a run not learning (or learning badly): with one of them, advice
# becomes a finding and may explain them. Overfit/Overtraining and Confusion are left out: they
# say what the model learnt, not that it fails to learn, and data advice is no cause of them in
# the explanation graph anyway.
LEARNING_SYMPTOMS: frozenset[str] = frozenset({
    NON_FINITE, "ExplodingTensor", "WeightUpdateRatio", "AllZero", "DeadRelu", "SaturatedActivation",
    "VanishingGradient", "UnchangedTensor", "LossNotDecreasing", "Underfitting", MISPREDICTION,
})  # fmt: skip

_NOT_ADVICE_KINDS = frozenset({NON_FINITE, MISPREDICTION})


def advises_by_default(
    rule: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    *,
    certain: bool = False,
    declared: bool | None = None,
) -> bool:
    """Whether a finding of ``rule`` is advice when its rule does not say (see the module docstring).

    ``declared`` is the rule class's ``advises`` attribute (None: decided by :data:`ADVISING_RULES`).
    """
    if certain:
        return False
    if declared is None:
        declared = rule in ADVISING_RULES
    if not declared:
        return False
    return finding_kind({"rule": rule, "message": message, "details": details or {}}) not in _NOT_ADVICE_KINDS


def rule_advises(rule_class: type) -> bool:
    """Whether a rule class's (uncertain) findings are advice: its ``advises``, else the list."""
    declared = getattr(rule_class, "advises", None)
    if declared is not None:
        return bool(declared)
    name = rule_class.name() if hasattr(rule_class, "name") else getattr(rule_class, "__name__", "")
    return name in ADVISING_RULES


def is_advice(finding: Mapping[str, Any]) -> bool:
    """Whether a serialised finding (``StepResult.to_dict()``) is advice."""
    return bool(finding.get("advice")) and finding.get("fired", True) is not False


def advice_details(findings: list[Mapping[str, Any]]) -> str:
    """SageMaker StatusDetails for a rule whose findings are all advice: ``Advice: <first message>``."""
    first = findings[0] if findings else {}
    step = first.get("step")
    where = f" at step {step}" if step is not None and int(step) >= 0 else ""
    return f"{ADVICE_PREFIX} {first.get('rule', '')}{where}: {first.get('message', '')}".rstrip(": ") + "\n"
