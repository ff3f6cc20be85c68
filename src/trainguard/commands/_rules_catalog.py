"""``trainguard rules list`` and ``trainguard rules describe``: the rules there are (built-ins and
plug-ins), their parameters, and what each one's findings mean (advice or issue, its semantics,
its fix hints). ``trainguard.commands.rules`` registers both verbs beside ``rules run``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.rules.base import Rule

__all__ = ["describe_rule", "list_rules"]


def _rule_classes() -> dict[str, type[Rule]]:
    from importlib import metadata

    from trainguard.rules import builtin_rules
    from trainguard.rules.compat import resolve_rule_class
    from trainguard.rules.registry import ENTRY_POINT_GROUP

    classes: dict[str, type[Rule]] = dict(builtin_rules())
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            classes[entry.name] = resolve_rule_class(entry.name)
        except Exception as error:  # noqa: BLE001 - a broken plug-in must not hide the others
            print(f"trainguard: plug-in rule {entry.name!r} cannot be loaded: {error}", file=sys.stderr)
    return classes


def _parameter_rows(rule_class: type[Rule]) -> list[tuple[str, str, str]]:
    """(name, default, doc) per parameter, for list and describe."""
    from trainguard.rules.compat import SmdebugRuleAdapter

    if issubclass(rule_class, SmdebugRuleAdapter):
        return [(key, repr(value), "") for key, value in rule_class.constructor_parameters().items()]
    rows = []
    for key, param in rule_class.parameters().items():
        default = repr(param.default)
        if param.documented_default is not None and param.documented_default != param.default:
            default += f" (SageMaker documents {param.documented_default!r})"
        rows.append((key, default, param.doc))
    return rows


def list_rules(args: argparse.Namespace) -> int:
    """``trainguard rules list [--json]``: every available rule with its parameters."""
    from trainguard.rules.advice import rule_advises

    classes = _rule_classes()
    if args.json:
        document = [
            {
                "name": name,
                "kind": getattr(cls, "kind", "debugger"),
                "description": cls.describe(),
                "collections": list(getattr(cls, "collections", ())),
                "advises": rule_advises(cls),
                "parameters": {key: default for key, default, _ in _parameter_rows(cls)},
            }
            for name, cls in classes.items()
        ]
        print(json.dumps(document, indent=2))
        return 0
    for name, cls in classes.items():
        advises = " (advises)" if rule_advises(cls) else ""
        print(f"{name}  [{getattr(cls, 'kind', 'debugger')}]{advises}  {cls.describe()}")
        params = ", ".join(f"{key}={default}" for key, default, _ in _parameter_rows(cls))
        if params:
            print(f"    parameters: {params}")
    return 0


def describe_rule(args: argparse.Namespace) -> int:
    """``trainguard rules describe NAME``: a rule's condition, collections, stop policy and parameters."""
    from trainguard.rules.compat import resolve_rule_class

    cls = resolve_rule_class(args.name)
    print(f"{cls.name()}  [{getattr(cls, 'kind', 'debugger')}]")
    doc = (cls.__doc__ or "").strip()
    module_doc = (sys.modules.get(cls.__module__).__doc__ or "").strip() if cls.__module__ in sys.modules else ""
    if doc:
        print(f"\n{doc}")
    if module_doc and module_doc != doc:
        print(f"\n{module_doc}")
    if getattr(cls, "collections", ()):
        print(f"\ncollections it needs saved: {', '.join(cls.collections)}")
    print(f"\nstop policy: {getattr(cls, 'stop_policy', 'never stops training: findings are reported only')}")
    print("  (--stop-on-issue and the stoptraining action act only on certain findings; others are reported)")
    _describe_advice(cls)
    _describe_semantics(cls)
    _describe_fix_hints(cls)
    rows = _parameter_rows(cls)
    print("\nparameters:" if rows else "\nparameters: none")
    for key, default, text in rows:
        print(f"  {key} = {default}" + (f"  -- {text}" if text else ""))
    return 0


def _describe_advice(cls: type[Rule]) -> None:
    from trainguard.rules.advice import ADVISING_RULES, LEARNING_SYMPTOMS, rule_advises

    if not rule_advises(cls):
        print("\nadvice: no; its findings are issues (IssuesFound)")
        return
    about = ADVISING_RULES.get(cls.name(), "a property of the data or the initialisation")
    print(f"\nadvice: yes; its uncertain findings about {about} are advice:")
    print("  a property of the data or the initialisation, not a learning symptom: the rule ends NoIssuesFound")
    print("  (SageMaker StatusDetails 'Advice: ...'), raises no alarm, stops nothing, is never the primary finding")
    print("  and does not make 'rules run' exit 1. It becomes a finding, a possible cause beside the primary,")
    print("  when the run shows a learning symptom: " + ", ".join(sorted(LEARNING_SYMPTOMS)))


def _describe_semantics(cls: type) -> None:
    from trainguard.rules.params import CALIBRATED, SAGEMAKER

    parameters = cls.parameters() if hasattr(cls, "parameters") else {}
    if "semantics" not in parameters:
        print("\nsemantics: one (the rule has no 'semantics' parameter)")
        return
    default = parameters["semantics"].default
    print(f"\nsemantics (parameter 'semantics', default {default!r}):")
    print(f"  {CALIBRATED}: trainguard's verdict: a trend judged against the run's own noise, or a condition")
    print("      that persists over its window (parameter 'window' where the rule has one); the default")
    print("      everywhere, the SageMaker-compatible endpoint included")
    overrides = dict(getattr(cls, "sagemaker_overrides", {}) or {})
    documented = ", ".join(f"{key}={value!r}" for key, value in overrides.items())
    print(f"  {SAGEMAKER}: SageMaker's documented single-step condition, only when a configuration asks for it")
    if documented:
        print(f"      (with SageMaker's documented defaults: {documented})")


def _describe_fix_hints(cls: type) -> None:
    hints = dict(getattr(cls, "fix_hints", {}) or {})
    generic = getattr(cls, "fix_hint", "")
    if not hints and not generic:
        return
    print("\nfix hints when it fires:")
    for framework in ("pytorch", "keras", "xgboost"):
        if framework in hints:
            print(f"  {framework}: {hints[framework]}")
    for framework, hint in hints.items():
        if framework not in ("pytorch", "keras", "xgboost"):
            print(f"  {framework}: {hint}")
    if generic:
        print(f"  {'any other' if hints else 'any framework'}: {generic}")
