"""A rule configuration: which rule, with which parameters and actions, under which name.

The command line form is ``NAME[:key=value,key=value]``, e.g.
``VanishingGradient:threshold=1e-6``; a list value keeps its commas
(``AllZero:tensor_regex=.*bias,.*weight,threshold=90``). ``NAME`` may be
``package.module:Class``, with parameters after a second colon. ``name=CONFIG`` names the
configuration (``StepOutlier:name=fast,stddev=3``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["RuleSpec"]


@dataclass(frozen=True)
class RuleSpec:
    """One rule configuration (SageMaker's ``DebugRuleConfiguration`` in Python form).

    Attributes:
        rule: the rule's name (``rule_to_invoke``) or a ``module:Class`` path.
        parameters: rule parameters; strings are parsed as SageMaker sends them.
        configuration_name: ``RuleConfigurationName``; defaults to ``rule``.
        actions: action dicts as in SageMaker's ``action_json`` (``{"name": "stoptraining"}``...).
    """

    rule: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    configuration_name: str = ""
    actions: tuple[Mapping[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return self.configuration_name or self.rule

    @classmethod
    def parse(cls, text: str) -> RuleSpec:
        """``NAME`` or ``NAME:key=value,key=value`` (values as strings, like SageMaker's)."""
        text = text.strip()
        if not text:
            raise ConfigError("empty rule: expected NAME or NAME:key=value,...")
        head, sep, tail = text.partition(":")
        # 'pkg.mod:Class' and 'pkg.mod:Class:key=value' are custom rules.
        if sep and "=" not in tail.split(":", 1)[0]:
            class_part, _, tail = tail.partition(":")
            head = f"{head}:{class_part}"
        parameters: dict[str, str] = {}
        last_key = None
        for item in (part.strip() for part in tail.split(",")) if tail else ():
            key, eq, value = item.partition("=")
            if eq and key.strip() and not any(c in key for c in "*.|()[]"):
                last_key = key.strip()
                parameters[last_key] = value.strip()
            elif last_key is not None:
                # A part without key= continues a list value: tensor_regex=a,b,threshold=3
                parameters[last_key] += "," + item
            else:
                raise ConfigError(f"rule {text!r}: {item!r} is not key=value")
        # name= is the configuration's name (SageMaker's RuleConfigurationName), not a parameter:
        # one rule can then run twice with different parameters.
        configuration_name = parameters.pop("name", None)
        if configuration_name is not None and not configuration_name.strip():
            raise ConfigError(f"rule {text!r}: name= needs a configuration name")
        return cls(rule=head.strip(), parameters=parameters, configuration_name=(configuration_name or "").strip())
