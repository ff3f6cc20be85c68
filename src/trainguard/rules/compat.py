"""Running rules written for smdebug, and a drop-in base class for porting them.

An smdebug rule looks like::

    from smdebug.rules.rule import Rule          # port: from trainguard.rules.compat import Rule

    class CustomGradientRule(Rule):
        def __init__(self, base_trial, threshold=10.0):
            super().__init__(base_trial)
            self.threshold = float(threshold)

        def invoke_at_step(self, step):
            for name in self.base_trial.tensor_names(regex="gradient"):
                if abs(self.base_trial.tensor(name).value(step)).mean() > self.threshold:
                    return True
            return False

:func:`make_rule` accepts such a class (from ``module:Class``, an entry point, or smdebug itself)
and wraps it in :class:`SmdebugRuleAdapter`, a trainguard :class:`~trainguard.rules.base.Rule`:
``True`` becomes a finding, ``RuleEvaluationConditionMet`` (raised by ``invoke``) too, and
smdebug's "data not there" exceptions are recognised by name, so rules that import them from
smdebug or from :mod:`trainguard.errors` both work. String parameters (SageMaker sends only
strings) are converted to the type of the constructor argument's default.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from trainguard.errors import (
    ConfigError,
    NoMoreData,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    TrainguardError,
)
from trainguard.rules import create_rule, get_rule_class
from trainguard.rules.actions import spec_actions
from trainguard.rules.base import MissingTensor, StepResult
from trainguard.rules.base import Rule as NativeRule
from trainguard.rules.params import parse_bool
from trainguard.rules.spec import RuleSpec

__all__ = [
    "NoMoreData",
    "validate_specs",
    "Rule",
    "RuleEvaluationConditionMet",
    "SmdebugRuleAdapter",
    "StepUnavailable",
    "TensorUnavailable",
    "TensorUnavailableForStep",
    "is_smdebug_style",
    "make_rule",
    "resolve_rule_class",
]

_SKIP_NAMES = {"TensorUnavailableForStep", "StepUnavailable", "NoMoreData", "StepNotYetAvailable", "NoMoreProfilerData"}
_MISSING_NAMES = {"TensorUnavailable"}


class RuleEvaluationConditionMet(TrainguardError):
    """smdebug's "the rule fired" exception; ``str()`` is SageMaker's StatusDetails text."""

    def __init__(self, rule_name: str, step: int, end_of_rule: bool = False) -> None:
        super().__init__(f"Evaluation of the rule {rule_name} at step {step} resulted in the condition being met")
        self.rule_name = rule_name
        self.step = step
        self.end_of_rule = end_of_rule


class Rule:
    """Base class with smdebug's rule interface, for porting smdebug rules unchanged.

    Subclasses implement ``invoke_at_step(step) -> bool``; ``invoke(step)`` raises
    :class:`RuleEvaluationConditionMet` when it returns True, as smdebug's did.
    """

    def __init__(self, base_trial: Any, action_str: str = "", other_trials: list[Any] | None = None) -> None:
        self.base_trial = base_trial
        self.other_trials = list(other_trials or [])
        self.action_str = action_str
        self.logger = logging.getLogger(f"trainguard.rules.{type(self).__name__}")
        self.rule_name = type(self).__name__

    def invoke_at_step(self, step: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__} must implement invoke_at_step(step)")

    def invoke(self, step: int) -> None:
        if self.invoke_at_step(step):
            raise RuleEvaluationConditionMet(self.rule_name, step)


def is_smdebug_style(rule_class: Any) -> bool:
    """A class with ``invoke_at_step`` that is not a trainguard rule."""
    return (
        isinstance(rule_class, type)
        and not issubclass(rule_class, NativeRule)
        and callable(getattr(rule_class, "invoke_at_step", None))
    )


def _convert(value: Any, default: Any) -> Any:
    """SageMaker sends strings: give the constructor the type its default has."""
    if not isinstance(value, str) or default is inspect.Parameter.empty or default is None:
        return None if isinstance(value, str) and value.strip() == "None" else value
    if value.strip() == "None":
        return None
    try:
        if isinstance(default, bool):
            return parse_bool(value)
        if isinstance(default, int):
            return int(float(value)) if "." in value or "e" in value.lower() else int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, (list, tuple)):
            return [part.strip() for part in value.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"parameter value {value!r} is not a valid {type(default).__name__}") from None
    return value


class SmdebugRuleAdapter(NativeRule):
    """A trainguard rule that runs an smdebug-style rule object. Made per class by :func:`adapt`."""

    wrapped_class: ClassVar[type[Any]] = object
    abstract = True

    def __init__(self, base_trial: Any, *, action_json: Any = None, other_trials: Any = (), **parameters: Any) -> None:
        self.base_trial = base_trial
        self.other_trials = list(other_trials)
        self.action_json = action_json
        cls = self.wrapped_class
        arguments = self.check_parameters(parameters)
        accepted = self._accepted()
        if "other_trials" in accepted and self.other_trials:
            arguments["other_trials"] = self.other_trials
        if "action_str" in accepted and action_json is not None:
            arguments["action_str"] = action_json if isinstance(action_json, str) else str(action_json)
        try:
            self.wrapped = cls(base_trial, **arguments)
        except TypeError as error:
            raise ConfigError(f"{cls.__name__}: cannot be created with {sorted(arguments)}: {error}") from None

    @classmethod
    def _accepted(cls) -> dict[str, inspect.Parameter]:
        try:
            return dict(inspect.signature(cls.wrapped_class.__init__).parameters)
        except (TypeError, ValueError):
            return {}

    @classmethod
    def check_parameters(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments from rule parameters (strings converted by the defaults' types).

        Raises:
            ConfigError: a parameter the constructor does not take, or a value of the wrong type.
        """
        name = cls.wrapped_class.__name__
        accepted = cls._accepted()
        takes_kwargs = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        unknown = sorted(key for key in parameters if key not in accepted and key != "action_json" and not takes_kwargs)
        if unknown:
            valid = (
                ", ".join(k for k in accepted if k not in ("self", "base_trial", "action_str", "other_trials"))
                or "(none)"
            )
            raise ConfigError(f"{name}: unknown parameter(s) {', '.join(unknown)}; its constructor takes: {valid}")
        arguments: dict[str, Any] = {}
        for key, value in parameters.items():
            if key == "action_json":
                continue
            default = accepted[key].default if key in accepted else inspect.Parameter.empty
            try:
                arguments[key] = _convert(value, default)
            except ConfigError as error:
                raise ConfigError(f"{name}: parameter {key}: {error}") from None
        return arguments

    @classmethod
    def name(cls) -> str:
        return cls.rule_name or cls.wrapped_class.__name__

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def constructor_parameters(cls) -> dict[str, Any]:
        """The wrapped constructor's parameters and defaults (for ``trainguard rules describe``)."""
        try:
            signature = inspect.signature(cls.wrapped_class.__init__)
        except (TypeError, ValueError):
            return {}
        return {
            key: (None if p.default is inspect.Parameter.empty else p.default)
            for key, p in signature.parameters.items()
            if key not in ("self", "base_trial", "action_str", "other_trials")
            and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        }

    @classmethod
    def describe(cls) -> str:
        return (cls.wrapped_class.__doc__ or "smdebug-style custom rule").strip().split("\n\n", 1)[0]

    def check(self, step: int) -> StepResult | None:
        try:
            fired = bool(self.wrapped.invoke_at_step(step))
        except Exception as error:  # noqa: BLE001 - smdebug's exceptions are matched by class name
            kind = type(error).__name__
            if kind == "RuleEvaluationConditionMet":
                return self.issue(step, str(error))
            if kind in _SKIP_NAMES:
                return None
            if kind in _MISSING_NAMES:
                return self.missing(step, MissingTensor(str(error).strip("'\"")))
            raise
        if fired:
            return self.issue(step, f"{self.name()}.invoke_at_step({step}) returned True")
        return self.no_issue(step)


def adapt(rule_class: type) -> type[NativeRule]:
    """A :class:`SmdebugRuleAdapter` subclass that runs ``rule_class``."""
    return type(
        rule_class.__name__,
        (SmdebugRuleAdapter,),
        {
            "wrapped_class": rule_class,
            "rule_name": rule_class.__name__,
            "abstract": False,
            "__doc__": rule_class.__doc__,
            "__module__": rule_class.__module__,
            "collections": tuple(getattr(rule_class, "collections", ()) or ()),
        },
    )


def resolve_rule_class(name: str) -> type[NativeRule]:
    """The trainguard rule class for a name, entry point or ``module:Class``, adapting
    smdebug-style classes.

    Raises:
        ConfigError: unknown name (listing the valid ones) or not a rule class.
    """
    rule_class = get_rule_class(name)
    if isinstance(rule_class, type) and issubclass(rule_class, NativeRule):
        return rule_class
    if is_smdebug_style(rule_class):
        return adapt(rule_class)
    raise ConfigError(
        f"{name!r} is not a rule: expected a subclass of trainguard.rules.Rule (implementing check(step)) "
        "or an smdebug-style class with invoke_at_step(step)"
    )


def make_rule(base_trial: Any, spec: RuleSpec, other_trials: Any = ()) -> NativeRule:
    """Instantiate the rule ``spec`` names; smdebug-style classes are adapted."""
    rule_class = resolve_rule_class(spec.rule)
    if issubclass(rule_class, SmdebugRuleAdapter):
        return rule_class(base_trial, other_trials=other_trials, **dict(spec.parameters))
    return create_rule(base_trial, spec, other_trials)


_RESERVED = {"action_json", "rule_to_invoke", "base_trial", "other_trials"}


def validate_specs(specs: Sequence[RuleSpec]) -> dict[str, type[NativeRule]]:
    """Resolve every spec's class and check its parameters, before anything runs.

    Returns:
        {configuration name: rule class}.

    Raises:
        ConfigError: no rules, duplicate configuration names, unknown rule (the message lists the
            valid ones), unknown or invalid parameters, unparsable action_json.
    """
    if not specs:
        raise ConfigError("no rules given: name at least one rule (trainguard rules list shows them)")
    classes: dict[str, type[NativeRule]] = {}
    for spec in specs:
        if not isinstance(spec, RuleSpec):
            raise ConfigError(f"expected a RuleSpec, got {spec!r}")
        if spec.name in classes:
            raise ConfigError(
                f"two rule configurations are named {spec.name!r}: give each a distinct configuration_name"
            )
        rule_class = resolve_rule_class(spec.rule)
        spec_actions(spec)
        if issubclass(rule_class, SmdebugRuleAdapter):
            rule_class.check_parameters(dict(spec.parameters))
        else:
            declared = rule_class.parameters()
            unknown = sorted(set(spec.parameters) - set(declared) - _RESERVED)
            if unknown:
                valid = ", ".join(sorted(declared)) or "(none)"
                raise ConfigError(
                    f"{rule_class.name()}: unknown parameter(s) {', '.join(unknown)}; valid parameters: {valid}"
                )
            for key, value in spec.parameters.items():
                if key in declared:
                    declared[key].parse(rule_class.name(), value)
        classes[spec.name] = rule_class
    return classes
