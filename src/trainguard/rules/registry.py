"""Finding rule classes by name: built-ins, ``module:Class`` paths, and the ``trainguard.rules``
entry-point group.

Built-ins live one per module in :mod:`trainguard.rules.builtin`; they are discovered by
importing that package's modules, so adding a rule means adding a module, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from importlib import metadata
from typing import Any

from trainguard.errors import ConfigError
from trainguard.rules.base import Rule

__all__ = ["builtin_rules", "get_rule_class", "load_rule_class", "rule_names"]

ENTRY_POINT_GROUP = "trainguard.rules"


@cache
def builtin_rules() -> dict[str, type[Rule]]:
    """Every built-in rule class by its SageMaker name."""
    from trainguard.rules import builtin

    found: dict[str, type[Rule]] = {}
    for module_info in pkgutil.iter_modules(builtin.__path__):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{builtin.__name__}.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__:
                if getattr(value, "abstract", False):
                    continue
                found[value.name()] = value
    return dict(sorted(found.items()))


def _entry_point_rules() -> dict[str, Any]:
    return {entry.name: entry for entry in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def rule_names() -> list[str]:
    return sorted(set(builtin_rules()) | set(_entry_point_rules()))


def load_rule_class(path: str) -> type:
    """``package.module:ClassName`` → the class (a Rule, or an smdebug-style rule to adapt)."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"custom rule {path!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"custom rule {path!r}: cannot import {module_name}: {error}") from None
    try:
        return getattr(module, class_name)
    except AttributeError:
        raise ConfigError(f"custom rule {path!r}: {module_name} has no {class_name}") from None


def get_rule_class(name: str) -> type:
    """A rule class by SageMaker name (case-insensitive), entry-point name, or ``module:Class``.

    Raises:
        ConfigError: unknown name; the message lists the valid ones.
    """
    if ":" in name:
        return load_rule_class(name)
    builtins = builtin_rules()
    if name in builtins:
        return builtins[name]
    by_lower = {key.lower(): value for key, value in builtins.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    entry_points = _entry_point_rules()
    if name in entry_points:
        return entry_points[name].load()
    raise ConfigError(
        f"unknown rule {name!r}. Built-in rules: {', '.join(builtins)}"
        + (f"; installed plug-ins: {', '.join(sorted(entry_points))}" if entry_points else "")
        + ". A custom rule is given as 'package.module:ClassName'."
    )
