"""One diagnosis per run: the primary finding with its fix, what it explains, and the rest.

A real fault trips several rules at once: a learning rate far too high makes the loss NaN, the
NaN activations look like "dead" ReLUs, the update ratios become huge and the loss stops
decreasing. Listing five findings side by side leaves the user to work out which one to fix.
:func:`diagnose` ranks them instead:

* a finding is **explained** by another when the explanation graph below has an edge from the
  other's kind to its kind and the cause came first (same step or earlier; symptoms in the loss
  are judged over windows and lag behind, so their step does not have to be later);
* the **primary** finding is the best-supported cause of the earliest *certain* finding: among
  the findings that explain it (directly or through others) and that nothing explains, the one
  that explains most of the run's findings (ties: the earlier, then the one earlier in
  ``CAUSAL_ORDER``, root causes before symptoms). A certain finding is what stops training, and
  what stops training is often a consequence (saturated sigmoids after a learning rate far too
  high): the stop and the first fix must name the cause. Without a certain finding, the primary is
  the earliest finding nothing explains;
* its **consequences** are the findings it explains, directly or through another consequence;
* everything else is **other** (independent problems, or ones explained only by them);
* rules that could not evaluate the run are listed as **not_evaluated**, never as "no issues".

**Advice** (``advice: true`` findings, see :mod:`trainguard.rules.advice`: a property of the data
or the initialisation) is never the primary finding. On a run without a learning symptom
(``LEARNING_SYMPTOMS``) it is listed under **advice** and nothing more: unnormalised features,
images in [0, 1] or imbalanced labels on a run that learns are not a fault. Once the run shows a
learning symptom the advice is *promoted*: it is a finding and a candidate cause, listed under
**possible_causes** (with ``explains`` and ``why``) when the graph lets it explain a finding, else
under **other**. It still does not displace the primary: a data or initialisation property fires on
healthy twins of a faulty run too, so it is weaker evidence than the symptom's own cause; the
user reads it beside the primary ("possible cause"), not instead of it.

A finding's kind is its rule's name, except that any finding about NaN or infinite values is of
kind ``NonFinite``, whichever rule reported it (ExplodingTensor, DeadRelu, a loss rule...).

Input: rule results as in ``rule-output/<name>.json`` (or :func:`trainguard.summary.
rule_results_from_updates`); output: ``{"primary": [...], "consequences": [...], "other": [...],
"possible_causes": [...], "advice": [...], "not_evaluated": [...]}`` where a finding is
``{rule, step, worker, message, fix_hint, certain, advice}`` (promoted advice adds ``promoted: true``;
a finding first seen uncertain and certain at a later step adds ``certain_from``, that step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.rules.advice import LEARNING_SYMPTOMS
from trainguard.rules.kinds import MISPREDICTION, NON_FINITE, finding_kind

__all__ = [
    "CAUSAL_ORDER", "EXPLAINS", "NON_FINITE", "diagnose", "finding_kind", "names_workers", "render_diagnosis",
    "role_of",
]  # fmt: skip

_NOT_EVALUATED_PREFIX = "RuleNotEvaluated:"


@dataclass(frozen=True)
class Edge:
    cause: str
    effect: str
    why: str


def _edges(cause: str, why_by_effect: Mapping[str, str]) -> list[Edge]:
    return [Edge(cause, effect, why) for effect, why in why_by_effect.items()]


# The explanation graph: "a finding of kind `cause` explains a finding of kind `effect`".
EXPLAINS: tuple[Edge, ...] = (
    *_edges(NON_FINITE, {
        "DeadRelu": "NaN activations compare false with > 0, so a layer full of NaN looks dead",
        "WeightUpdateRatio": "a NaN or inf weight or update makes the update ratio huge or undefined",
        "ExplodingTensor": "once one value is inf or NaN, everything computed from it is too",
        "SaturatedActivation": "inf pre-activations pin tanh/sigmoid at their limits",
        "VanishingGradient": "NaN gradients carry no signal; the layers before them stop learning",
        "UnchangedTensor": "weights updated with NaN stay NaN: they no longer change",
        "AllZero": "an overflowed layer is often zeroed by the operations after it",
        "TensorVariance": "the variance of a tensor holding inf or NaN is inf or NaN",
        "PoorWeightInitialization": "non-finite weights break the statistics that judge initialisation",
        "LossNotDecreasing": "a NaN loss cannot decrease",
        "Underfitting": "a NaN loss never reaches a good value",
        "Overfit": "a NaN training or validation loss makes their gap meaningless",
        "Overtraining": "a NaN validation loss looks like one that stopped improving",
    }),  # fmt: skip
    *_edges("ExplodingTensor", {
        NON_FINITE: "values growing without bound overflow to inf, then NaN",
        "WeightUpdateRatio": "exploding gradients make every update huge relative to its weights",
        "DeadRelu": "huge updates push pre-activations negative for good",
        "SaturatedActivation": "huge pre-activations pin tanh/sigmoid at their limits",
        "LossNotDecreasing": "a diverging network's loss does not decrease",
        "Underfitting": "a diverging network never fits",
    }),  # fmt: skip
    # Update ratios far too large are the learning rate being too high: the same consequences.
    *_edges("WeightUpdateRatio", {
        NON_FINITE: "updates far too large overflow the weights",
        "ExplodingTensor": "updates far too large make weights and gradients grow without bound",
        "DeadRelu": "updates far too large push pre-activations negative for good",
        "SaturatedActivation": "updates far too large pin tanh/sigmoid at their limits",
        # the same dead or saturated units, seen in the gradients: a softmax pinned at exactly 0 and 1
        # or a layer of dead ReLUs passes back gradients that are exactly zero; AllZero reads those
        # gradients where DeadRelu/SaturatedActivation may have nothing to read (functional softmax)
        "AllZero": "updates far too large kill or saturate the units after them (ReLUs dead, a softmax at exactly "
        "0 and 1): the gradients behind them are all zeros",
        "UnchangedTensor": "updates far too small leave the weights unchanged",
        # through saturation the SaturatedActivation rule may not see (no tanh/sigmoid inputs saved)
        "VanishingGradient": "updates far too large drive tanh/sigmoid into their flat regions, where gradients vanish",
        "LossNotDecreasing": "a learning rate far off makes the loss oscillate or stall",
        "Underfitting": "a learning rate far off keeps the model from fitting",
    }),  # fmt: skip
    *_edges("PoorWeightInitialization", {
        "VanishingGradient": "weights initialised too small shrink the gradient layer by layer",
        "ExplodingTensor": "weights initialised too large grow the activations layer by layer",
        "SaturatedActivation": "weights initialised too large saturate tanh/sigmoid from the start",
        "DeadRelu": "a bad initial scale or bias leaves ReLUs inactive from the start",
        "WeightUpdateRatio": "badly scaled weights make the update ratio extreme",
        "UnchangedTensor": "weights that get no gradient from a bad initialisation do not change",
        "LossNotDecreasing": "a network that cannot propagate signal does not learn",
        "Underfitting": "a network that cannot propagate signal does not fit",
    }),  # fmt: skip
    *_edges("NotNormalizedData", {
        "SaturatedActivation": "unscaled inputs saturate the first layer's activations",
        "ExplodingTensor": "unscaled inputs make the first layer's activations and gradients huge",
        "DeadRelu": "inputs of one sign and a large scale kill ReLUs",
        "WeightUpdateRatio": "unscaled inputs make the first layer's gradient, and its updates, extreme",
        "PoorWeightInitialization": "an initialisation for unit-scale inputs is wrong for unscaled ones",
        "LossNotDecreasing": "badly conditioned inputs slow or stall learning",
        "Underfitting": "badly conditioned inputs keep the model from fitting",
    }),  # fmt: skip
    *_edges("CheckInputImages", {
        "SaturatedActivation": "unnormalised images saturate the first layer's activations",
        "ExplodingTensor": "unnormalised images make the first layer's activations huge",
        "DeadRelu": "unnormalised images kill ReLUs",
        "WeightUpdateRatio": "unnormalised images make the first layer's gradient, and its updates, extreme",
        "PoorWeightInitialization": "an initialisation for unit-scale inputs is wrong for unnormalised images",
        "LossNotDecreasing": "badly conditioned inputs slow or stall learning",
        "Underfitting": "badly conditioned inputs keep the model from fitting",
    }),  # fmt: skip
    *_edges("VanishingGradient", {
        "UnchangedTensor": "weights whose gradient vanished do not change",
        "WeightUpdateRatio": "a vanished gradient makes the updates tiny relative to the weights",
        "LossNotDecreasing": "layers without gradient do not learn, so the loss stalls",
        "Underfitting": "layers without gradient do not learn, so the model does not fit",
    }),  # fmt: skip
    *_edges("DeadRelu", {
        "VanishingGradient": "dead ReLUs pass no gradient to the layers before them",
        "UnchangedTensor": "weights feeding only dead ReLUs get no gradient and do not change",
        "AllZero": "a layer of dead ReLUs outputs zeros",
        "LossNotDecreasing": "a network of dead units stops learning",
        "Underfitting": "a network of dead units cannot fit",
    }),  # fmt: skip
    *_edges("SaturatedActivation", {
        "VanishingGradient": "saturated tanh/sigmoid have a near-zero derivative",
        # float32 rounds 1 - tanh(x)^2 to exactly 0 beyond |x| ~ 9: the gradients behind are all zeros
        "AllZero": "saturated tanh/sigmoid have a derivative that rounds to zero: "
        "the gradients behind them are all zeros",
        "UnchangedTensor": "weights behind saturated units get no gradient and do not change",
        "LossNotDecreasing": "saturated units stop learning",
        "Underfitting": "saturated units keep the model from fitting",
    }),  # fmt: skip
    *_edges("AllZero", {
        "VanishingGradient": "an all-zero tensor passes no gradient",
        "UnchangedTensor": "weights with all-zero input or gradient do not change",
        "DeadRelu": "all-zero inputs leave ReLUs inactive",
        "LossNotDecreasing": "an all-zero layer carries no signal",
        "Underfitting": "an all-zero layer carries no signal",
    }),  # fmt: skip
    *_edges("UnchangedTensor", {
        "LossNotDecreasing": "weights that never change do not learn",
        "Underfitting": "weights that never change do not fit",
    }),  # fmt: skip
    *_edges("ClassImbalance", {
        "Underfitting": "a rare class is learnt poorly",
        "LossNotDecreasing": "a model predicting the majority class plateaus early",
        "Confusion": "a rare class is confused with the majority one",
    }),  # fmt: skip
    *_edges("Overfit", {"Overtraining": "a model that overfits stops improving on validation data"}),
    *_edges("LossNotDecreasing", {
        "Underfitting": "a loss that stalls high is a model that does not fit",
        MISPREDICTION: "a model that does not learn predicts some classes almost always wrong",
    }),  # fmt: skip
    *_edges("Underfitting", {MISPREDICTION: "a model that does not fit predicts some classes almost always wrong"}),
    *_edges("Confusion", {MISPREDICTION: "the same wrong predictions, seen by another rule"}),
)

# Root causes first, symptoms last: breaks ties between findings at the same step.
CAUSAL_ORDER: tuple[str, ...] = (
    "NotNormalizedData", "CheckInputImages", "ClassImbalance", "PoorWeightInitialization", NON_FINITE,
    "ExplodingTensor", "WeightUpdateRatio", "AllZero", "DeadRelu", "SaturatedActivation", "VanishingGradient",
    "UnchangedTensor", "TensorVariance", "Overfit", "Overtraining", "LossNotDecreasing", "Underfitting",
    "Confusion", MISPREDICTION,
)  # fmt: skip

# Judged over windows of the loss: reported late, so a cause need not come before them.
_LAGGING = frozenset({"LossNotDecreasing", "Underfitting", "Overfit", "Overtraining", MISPREDICTION})
_FINDING_KEYS = ("rule", "step", "worker", "message", "fix_hint", "certain", "advice")
_WHY = {(edge.cause, edge.effect): edge.why for edge in EXPLAINS}


def _rank(kind: str) -> int:
    return CAUSAL_ORDER.index(kind) if kind in CAUSAL_ORDER else len(CAUSAL_ORDER)


@dataclass
class _Entry:
    kind: str
    rule: str
    step: int
    finding: dict[str, Any]
    workers: list[str]
    advice: bool = False
    certain_step: int | None = None  # the earliest step of a certain finding of this entry

    def key(self) -> tuple[int, int, int, str]:
        return (self.step, _rank(self.kind), _rank(self.rule), self.rule)

    def document(self, **extra: Any) -> dict[str, Any]:
        document = {key: self.finding.get(key) for key in _FINDING_KEYS}
        document["rule"] = self.rule
        if self.certain_step is not None and not document.get("certain"):
            # first seen uncertain, confirmed later (ReplicaDivergence's second fingerprint): the
            # finding is certain, from that step on
            document["certain"] = True
            document["certain_from"] = self.certain_step
        if len(self.workers) > 1:
            document["workers"] = list(self.workers)
        return {**document, **extra}


def _explains(cause: _Entry, effect: _Entry) -> bool:
    if cause.kind == effect.kind == NON_FINITE and cause is not effect:
        # several rules seeing the same NaN: one problem, reported first (or by the rule
        # nearer the cause) by one of them
        return cause.key() < effect.key()
    if cause is effect or (cause.kind, effect.kind) not in _WHY:
        return False
    if (effect.kind, cause.kind) in _WHY:  # each could explain the other: the earlier one does
        return cause.key() < effect.key()
    return cause.step <= effect.step or effect.kind in _LAGGING


def _why(cause: _Entry, effect: _Entry) -> str:
    if cause.kind == effect.kind == NON_FINITE:
        return "the same non-finite values, seen by another rule"
    return _WHY[(cause.kind, effect.kind)]


def _entries(results: Iterable[Mapping[str, Any]]) -> list[_Entry]:
    """The earliest finding per (rule, kind, advice), across workers (the workers it was found on
    kept), with the earliest step one of them was certain at."""
    entries: dict[tuple[str, str, bool], _Entry] = {}
    for result in results:
        rule = str(result.get("rule") or result.get("configuration_name") or "")
        for finding in result.get("findings") or ():
            if not finding.get("fired", True):
                continue
            kind = finding_kind({**finding, "rule": rule})
            advice = bool(finding.get("advice"))
            step = int(finding.get("step", -1))
            certain = bool(finding.get("certain")) and not advice
            worker = finding.get("worker")
            entry = entries.get((rule, kind, advice))
            if entry is None:
                entry = entries[(rule, kind, advice)] = _Entry(kind, rule, step, dict(finding), [], advice)
            elif step < entry.step:
                entry.step, entry.finding = step, dict(finding)
            if worker and worker not in entry.workers:
                entry.workers.append(worker)
            if certain and (entry.certain_step is None or step < entry.certain_step):
                entry.certain_step = step
    for entry in entries.values():
        entry.workers.sort()
    return sorted(entries.values(), key=_Entry.key)


def _not_evaluated(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for result in results:
        details = str(result.get("status_details") or "").strip()
        if result.get("status") == "Error" and details.startswith(_NOT_EVALUATED_PREFIX):
            found.append(
                {
                    "rule": str(result.get("rule") or result.get("configuration_name") or ""),
                    "configuration_name": result.get("configuration_name"),
                    "reason": details[len(_NOT_EVALUATED_PREFIX) :].strip(),
                    # it does not apply to the run by its design (Rule.inapplicable), not missing data
                    "not_applicable": bool(result.get("not_applicable")),
                }
            )
    return found


def _closure(start: _Entry, entries: Sequence[_Entry], forward: bool) -> list[_Entry]:
    """What ``start`` explains (forward) or what explains it (backward), directly or not; in the
    order found (breadth first), ``start`` left out."""
    found: dict[int, _Entry] = {id(start): start}
    order: list[_Entry] = []
    frontier = [start]
    while frontier:
        current = frontier.pop(0)
        for entry in entries:
            linked = _explains(current, entry) if forward else _explains(entry, current)
            if id(entry) not in found and linked:
                found[id(entry)] = entry
                order.append(entry)
                frontier.append(entry)
    return order


def _primary(findings: Sequence[_Entry]) -> _Entry:
    """The best-supported cause of the earliest certain finding (see the module docstring)."""
    roots = [entry for entry in findings if not any(_explains(other, entry) for other in findings)]
    certain = [entry for entry in findings if entry.certain_step is not None]
    if not certain:
        # a cycle of mutual explanations cannot happen (the earlier one wins), but never end without one
        return min(roots or findings, key=_Entry.key)
    anchor = min(certain, key=lambda entry: (entry.certain_step, *entry.key()[1:]))
    causes = [entry for entry in [anchor, *_closure(anchor, findings, forward=False)] if entry in roots]
    return min(causes or [anchor], key=lambda entry: (-len(_closure(entry, findings, forward=True)), entry.key()))


def diagnose(results: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rank the findings of a run's rule results; see the module docstring."""
    entries = _entries(results)
    diagnosis: dict[str, list[dict[str, Any]]] = {
        "primary": [], "consequences": [], "other": [], "possible_causes": [], "advice": [],
        "not_evaluated": _not_evaluated(results),
    }  # fmt: skip
    findings = [entry for entry in entries if not entry.advice]
    advice = [entry for entry in entries if entry.advice]
    if not any(entry.kind in LEARNING_SYMPTOMS for entry in findings):
        diagnosis["advice"] = [entry.document() for entry in advice]
        advice = []
    if not findings:
        return diagnosis
    primary = _primary(findings)
    diagnosis["primary"].append(primary.document())
    explained: dict[int, _Entry] = {id(primary): primary}
    for entry in _closure(primary, findings, forward=True):  # consequences of consequences too
        # the first explained finding that explains it: the one the breadth-first search reached it from
        cause = next(c for c in explained.values() if _explains(c, entry))
        explained[id(entry)] = entry
        diagnosis["consequences"].append(entry.document(explained_by=cause.rule, why=_why(cause, entry)))
    diagnosis["other"] = [entry.document() for entry in findings if id(entry) not in explained]
    ranked = [primary, *(entry for entry in findings if entry is not primary)]  # explain the primary first
    for entry in advice:
        effect = next((other for other in ranked if _explains(entry, other)), None)
        if effect is None:
            diagnosis["other"].append(entry.document(promoted=True))
        else:
            diagnosis["possible_causes"].append(
                entry.document(promoted=True, explains=effect.rule, why=_why(entry, effect))
            )
    return diagnosis


def role_of(diagnosis: Mapping[str, Any], rule: str) -> str:
    """Where ``rule``'s findings stand: "primary", "consequence", "possible_cause", "other", "advice",
    "not_evaluated" or ""."""
    for role, section in (
        ("primary", "primary"), ("consequence", "consequences"), ("possible_cause", "possible_causes"),
        ("other", "other"), ("advice", "advice"), ("not_evaluated", "not_evaluated"),
    ):  # fmt: skip
        if any(item.get("rule") == rule for item in diagnosis.get(section) or ()):
            return role
    return ""


def _workers(finding: Mapping[str, Any]) -> list[str]:
    return list(finding.get("workers") or ([finding["worker"]] if finding.get("worker") else []))


def names_workers(findings: Iterable[Mapping[str, Any]]) -> bool:
    """Whether naming workers tells anything: some finding is on a worker other than worker_0."""
    return any(worker != "worker_0" for finding in findings for worker in _workers(finding))


def render_diagnosis(diagnosis: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """Human lines: the primary finding and its fix first, then what it explains, the rest, and
    the rules that could not evaluate. Workers are named when the run's findings are not all on
    worker_0 (a single-process run has only that one)."""
    sections = ("primary", "consequences", "possible_causes", "other", "advice")
    show = names_workers(finding for section in sections for finding in diagnosis.get(section) or ())

    def _where(finding: Mapping[str, Any]) -> str:
        workers = _workers(finding) if show else []
        return f"step {finding.get('step')}" + (f" on {', '.join(workers)}" if workers else "")

    lines: list[str] = []
    for finding in diagnosis.get("primary") or ():
        certainty = "" if finding.get("certain") else " (not certain)"
        if finding.get("certain_from") is not None:
            certainty = f" (certain from step {finding['certain_from']})"
        lines.append(
            f"{indent}diagnosis   : {finding.get('rule')} at {_where(finding)}{certainty}: {finding.get('message')}"
        )
        if finding.get("fix_hint"):
            lines.append(f"{indent}fix         : {finding.get('fix_hint')}")
    for finding in diagnosis.get("consequences") or ():
        lines.append(
            f"{indent}  explains  : {finding.get('rule')} at {_where(finding)} ({finding.get('why')})"
        )
    for finding in diagnosis.get("possible_causes") or ():
        lines.append(
            f"{indent}possible cause: {finding.get('rule')} at {_where(finding)} (advice, now that the run shows "
            f"{finding.get('explains')}: {finding.get('why')}): {finding.get('message')}"
        )
    for finding in diagnosis.get("other") or ():
        lines.append(f"{indent}also        : {finding.get('rule')} at {_where(finding)}: {finding.get('message')}")
    for finding in diagnosis.get("advice") or ():
        hint = f" ({finding.get('fix_hint')})" if finding.get("fix_hint") else ""
        where = f"{finding.get('rule')} at {_where(finding)}"
        lines.append(f"{indent}advice      : {where}: {finding.get('message')}{hint}")
    for item in diagnosis.get("not_evaluated") or ():
        lines.append(f"{indent}not evaluated: {item.get('rule')}: {item.get('reason')}")
    return lines
