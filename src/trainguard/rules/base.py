"""The rule framework: a rule declares what it needs and returns a result per evaluated step.

Findings are return values, not exceptions. A rule subclass implements :meth:`Rule.check`, which
looks at one global step of the trial and returns:

* ``self.issue(step, message, **details)`` when the condition is met,
* ``self.no_issue(step, **details)`` when it looked and found nothing,
* ``None`` when the step has nothing for this rule (e.g. its tensors are not saved at that step),
* ``self.missing(step, MissingTensor(...))`` when what it needs is not in the run at all.

``TensorUnavailable``/``TensorUnavailableForStep``/``StepUnavailable`` raised inside ``check`` are
turned into the same "missing" / "skipped" results by :meth:`Rule.evaluate`, so a rule never
crashes its runner because a tensor is not there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from trainguard.errors import ConfigError, StepUnavailable, TensorUnavailable, TensorUnavailableForStep
from trainguard.modes import ModeKeys
from trainguard.rules.advice import advises_by_default
from trainguard.rules.params import Param, parse_list
from trainguard.statuses import RuleStatus  # defined with the job statuses; the rules' public name

__all__ = ["MissingTensor", "Rule", "RuleStatus", "StepResult"]


# What a rule can read in an XGBoost run: the XGBoost hook's collections (hooks/xgboost.py, not
# imported here: it imports xgboost), its labels and predictions, and its evaluation metrics, which
# the loss rules read as the run's losses. A rule reading none of these (weights, gradients,
# activations, model inputs: a neural network's) cannot apply to a boosted model. A test keeps it
# in step with the hook.
XGBOOST_RULE_COLLECTIONS = frozenset(
    {"metrics", "hyperparameters", "feature_importance", "trees", "full_shap", "average_shap"}
    | {"labels", "predictions", "losses"}
)


@dataclass(frozen=True)
class MissingTensor:
    """What a rule needed and did not find, and how to make the hook save it."""

    what: str
    collection: str | None = None

    def describe(self) -> str:
        if self.collection:
            return f"{self.what} (save the collection {self.collection!r} in the hook config)"
        return f"{self.what} (include it with include_regex in the hook config)"


@dataclass(frozen=True)
class StepResult:
    """One evaluation of one rule at one global step."""

    rule: str
    step: int
    fired: bool
    message: str = ""
    fix_hint: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    missing: tuple[MissingTensor, ...] = ()
    # Whether this finding is certain enough to stop training (non-finite values, a condition
    # confirmed over its whole persistence window). ``--stop-on-issue`` and the stoptraining
    # action act only on certain findings; uncertain ones are reported.
    certain: bool = False
    # The worker (``worker_<rank>``) the finding is on; None when the rule judged the whole run.
    worker: str | None = None
    # Why the rule could not evaluate at all (its data is missing, the run is too short); None when
    # it did evaluate. A rule whose only results are "not evaluated" ends with status Error and
    # details "RuleNotEvaluated: <reason>", never NoIssuesFound: silence must mean "checked".
    not_evaluated: str | None = None
    # A property of the data or the initialisation, not a learning symptom (see
    # trainguard.rules.advice): reported as advice, never certain, never an issue on its own.
    advice: bool = False
    # With ``not_evaluated``: the rule does not apply to this run by the run's design (an XGBoost
    # rule on a PyTorch run, an image rule on a model fed no images), not "could not evaluate"
    # (data that should be there is missing). The status is the same (Error, RuleNotEvaluated);
    # summaries count such rules in one line instead of listing them as errors.
    not_applicable: bool = False

    @property
    def evaluated(self) -> bool:
        return not self.missing and self.not_evaluated is None

    def condition_met_details(self) -> str:
        """SageMaker's StatusDetails text for a rule that fired at this step."""
        return (
            f"RuleEvaluationConditionMet: Evaluation of the rule {self.rule} at step {self.step} "
            "resulted in the condition being met\n"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "step": self.step,
            "fired": self.fired,
            "message": self.message,
            "fix_hint": self.fix_hint,
            "details": dict(self.details),
            "missing": [{"what": m.what, "collection": m.collection} for m in self.missing],
            "certain": self.certain,
            "worker": self.worker,
            "not_evaluated": self.not_evaluated,
            "advice": self.advice,
            "not_applicable": self.not_applicable,
        }


_RESERVED_PARAMETERS = {"action_json", "rule_to_invoke", "base_trial", "other_trials"}


class Rule:
    """Base class of every rule, built-in or custom.

    Class attributes a subclass sets:

    * ``rule_name``: SageMaker's ``rule_to_invoke`` name (defaults to the class name).
    * ``fix_hint``: what to change when the rule fires; a finding may give a more specific one.
    * ``collections``: collections the hook must save for this rule (``trainguard rules`` uses it
      to configure capture and to say what to enable when tensors are missing).
    * ``kind``: ``"debugger"`` (reads tensors) or ``"profiler"`` (reads profiler data).
    * parameters: class attributes of type :class:`~trainguard.rules.params.Param`.
    """

    rule_name: ClassVar[str] = ""
    fix_hint: ClassVar[str] = ""
    # Framework-specific fix hints ("pytorch", "keras", "xgboost"); :meth:`hint_for` picks one
    # by the run's framework and falls back to ``fix_hint``.
    fix_hints: ClassVar[Mapping[str, str]] = {}
    # When a finding of this rule may stop training, in one sentence for ``rules describe``.
    stop_policy: ClassVar[str] = "never stops training: findings are reported only"
    collections: ClassVar[tuple[str, ...]] = ()
    # The frameworks whose captures can hold this rule's data; None: any framework.
    frameworks: ClassVar[tuple[str, ...] | None] = None
    kind: ClassVar[str] = "debugger"
    # Whether this rule's findings are advice (a property of the data or the initialisation, see
    # trainguard.rules.advice); None: the central list ADVISING_RULES decides by the rule's name.
    advises: ClassVar[bool | None] = None
    # Whether the rule reads nothing but its ``collections``: when every one of them is configured
    # in the run and none holds a tensor, the model has none (``inapplicable``). Off for rules that
    # read tensors by name (a custom rule's tensor outside its collections is missing data).
    reads_only_collections: ClassVar[bool] = False

    def __init__(
        self, base_trial: Any, *, action_json: Any = None, other_trials: Sequence[Any] = (), **parameters: Any
    ):
        self.base_trial = base_trial
        self.other_trials = parse_list(other_trials) if isinstance(other_trials, str) else list(other_trials)
        self.action_json = action_json
        declared = self.parameters()
        unknown = sorted(set(parameters) - set(declared) - _RESERVED_PARAMETERS)
        if unknown:
            valid = ", ".join(sorted(declared)) or "(none)"
            raise ConfigError(f"{self.name()}: unknown parameter(s) {', '.join(unknown)}; valid parameters: {valid}")
        for key, param in declared.items():
            raw = parameters.get(key, param.default)
            self.__dict__[key] = param.parse(self.name(), raw) if key in parameters else raw
        self.validate()

    # -- what subclasses implement -------------------------------------------------------------
    def validate(self) -> None:
        """Cross-parameter checks; raise ConfigError naming the parameters."""

    def check(self, step: int) -> StepResult | None:
        raise NotImplementedError

    def check_idle(self, now: float) -> StepResult | None:
        """Called by the runner on every poll without a new step (``now`` = ``time.time()``).

        For conditions about time or about data other than steps (stalled training, profiler
        metrics). The ``step`` of the result is the last step seen, or -1.
        """
        return None

    def finish(self) -> StepResult | None:
        """Called once after training ended and every step was checked: whole-run conditions."""
        return None

    # -- class-level facts ---------------------------------------------------------------------
    @classmethod
    def name(cls) -> str:
        return cls.rule_name or cls.__name__

    @classmethod
    def parameters(cls) -> dict[str, Param]:
        found: dict[str, Param] = {}
        for klass in reversed(cls.__mro__):
            for key, value in vars(klass).items():
                if isinstance(value, Param):
                    found[key] = value
        return found

    @classmethod
    def describe(cls) -> str:
        return (cls.__doc__ or "").strip().split("\n\n", 1)[0]

    def parameter_values(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.parameters()}

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, step: int) -> StepResult | None:
        """``check`` with missing-data errors turned into results; None means skipped."""
        try:
            return self.check(step)
        except TensorUnavailable as error:
            return self.missing(step, MissingTensor(str(error), self.collections[0] if self.collections else None))
        except (TensorUnavailableForStep, StepUnavailable):
            return None

    # -- result builders -----------------------------------------------------------------------
    def issue(
        self,
        step: int,
        message: str,
        *,
        fix_hint: str | None = None,
        certain: bool = False,
        advice: bool | None = None,
        **details: Any,
    ) -> StepResult:
        """A finding. ``certain=True`` only when it is sure enough to stop training (see ``stop_policy``).

        ``advice``: whether it describes the data or the initialisation rather than a learning
        symptom; None lets the rule's ``advises`` / the central list decide. Advice is never certain.
        """
        if advice is None:
            advice = advises_by_default(self.name(), message, details, certain=certain, declared=self.advises)
        return StepResult(
            self.name(), step, True, message, fix_hint or self.hint_for(self.framework()), details,
            certain=certain and not advice, advice=advice,
        )  # fmt: skip

    def framework(self) -> str | None:
        """The run's framework ("pytorch", "keras", "xgboost"), or None when the trial does not say."""
        getter = getattr(self.base_trial, "framework", None)
        try:
            value = getter() if callable(getter) else getter
        except Exception:  # a trial that cannot tell is not an error for the rule
            return None
        return value if isinstance(value, str) else None

    @classmethod
    def hint_for(cls, framework: str | None) -> str:
        """The fix hint for that framework, else the generic one."""
        if framework and framework in cls.fix_hints:
            return cls.fix_hints[framework]
        return cls.fix_hint

    def not_evaluated(self, reason: str, step: int = -1) -> StepResult:
        """The rule cannot judge this run (``reason`` says what is missing); never a finding."""
        return StepResult(self.name(), step, False, f"RuleNotEvaluated: {reason}", "", {}, not_evaluated=reason)

    def not_applicable(self, reason: str, step: int = -1) -> StepResult:
        """The rule does not apply to this run by its design (``reason`` says what the run lacks:
        no tanh, no images, another framework); reported as not evaluated, counted apart."""
        return replace(self.not_evaluated(reason, step), not_applicable=True)

    def inapplicable(self) -> str | None:
        """Why this rule cannot apply to this run by the run's design, or None; asked by the runner
        at the end about a rule that never evaluated a step and reported no missing tensor. Only a
        structured fact of the run counts here: its framework (``frameworks``), or, for a rule that
        ``reads_only_collections``, every one of them configured to be saved yet holding no tensor
        in the whole run (the model has no tanh: the hook would have saved its inputs). A
        collection never configured is missing data, not this; a tanh the hook cannot see (a
        custom op) reads the same as no tanh. Rules that read part of a collection (images among
        the model's inputs) override it."""
        trial = self.base_trial
        framework = self.framework()
        if self.frameworks is not None and framework is not None and framework not in self.frameworks:
            return f"applies to {'/'.join(self.frameworks)} runs only; this is a {framework} run"
        if framework == "xgboost" and self.collections and not set(self.collections) & XGBOOST_RULE_COLLECTIONS:
            # a neural network's tensors: "save the collection 'gradients'" is no advice for a booster
            return f"reads {', '.join(self.collections)}, which a boosted model does not have; this is an xgboost run"
        if not self.collections or not self.reads_only_collections:
            return None
        try:
            if not trial.steps():  # nothing saved at all: not a fact about the model
                return None
            known = trial.collections()
            if not all(name in known for name in self.collections):
                return None
            if any(trial.tensor_names(collection=name) for name in self.collections):
                return None
        except Exception:  # noqa: BLE001 - a trial that cannot say: "could not evaluate" stands
            return None
        return f"the run has no {' or '.join(self.collections)} tensors (its model has none to save)"

    def no_issue(self, step: int, message: str = "", **details: Any) -> StepResult:
        return StepResult(self.name(), step, False, message, "", details)

    def missing(self, step: int, *missing: MissingTensor) -> StepResult:
        text = "; ".join(item.describe() for item in missing)
        return StepResult(self.name(), step, False, f"missing: {text}", "", {}, tuple(missing))

    # -- helpers for tensor selection ----------------------------------------------------------
    def select_tensors(
        self,
        *,
        collection_names: Iterable[str] | None = None,
        tensor_regex: str | Iterable[str] | None = None,
        step: int | None = None,
        mode: ModeKeys = ModeKeys.GLOBAL,
        trial: Any = None,
    ) -> list[str]:
        """Names in the union of the collections and the regexes (SageMaker's semantics).

        With neither given, every tensor. Unknown collections are skipped (a live run may not
        have written them yet).
        """
        trial = trial or self.base_trial
        names: set[str] = set()
        if not collection_names and not tensor_regex:
            return trial.tensor_names(step=step, mode=mode)
        known = trial.collections()
        for collection in collection_names or ():
            if collection in known:
                names.update(trial.tensor_names(step=step, mode=mode, collection=collection))
        if tensor_regex:
            patterns = [tensor_regex] if isinstance(tensor_regex, str) else list(tensor_regex)
            names.update(trial.tensor_names(step=step, mode=mode, regex=patterns))
        return sorted(names)

    @staticmethod
    def regex_list(value: str | Sequence[str] | None) -> list[str]:
        if value is None:
            return []
        items = [value] if isinstance(value, str) else list(value)
        for item in items:
            re.compile(item)
        return items

    def __repr__(self) -> str:
        values = ", ".join(f"{key}={value!r}" for key, value in self.parameter_values().items())
        return f"{self.name()}({values})"
