"""Rule parameters: declared on the rule class, parsed from SageMaker's all-string values.

SageMaker sends every ``RuleParameters`` value as a string (``"None"``, ``"True"``, ``"1e-7"``,
``"a,b"``), while Python callers pass real values. A :class:`Param` accepts both and fails with a
:class:`~trainguard.errors.ConfigError` that names the rule, the parameter and the bad value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["CALIBRATED", "SAGEMAKER", "Param", "parse_bool", "parse_list", "semantics_param"]

_NONE_STRINGS = {"none", "null", ""}


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise ValueError(f"expected True or False, got {value!r}")


def parse_list(value: Any) -> list[str]:
    """A list, or a comma-separated string (SageMaker's form for list parameters)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, Sequence):
        return [str(part).strip() for part in value]
    raise ValueError(f"expected a list or a comma-separated string, got {value!r}")


def _parse_regex(value: Any) -> str:
    text = str(value)
    try:
        re.compile(text)
    except re.error as error:
        raise ValueError(f"{text!r} is not a valid regular expression: {error}") from None
    return text


_PARSERS: dict[Any, Callable[[Any], Any]] = {
    float: float,
    int: lambda value: int(float(value)) if isinstance(value, str) and "." in value else int(value),
    bool: parse_bool,
    str: str,
    list: parse_list,
    "regex": _parse_regex,
}


class Param:
    """One rule parameter.

    Args:
        kind: ``float``, ``int``, ``bool``, ``str``, ``list`` (of strings) or ``"regex"``.
        default: the value when the parameter is not given. May be None when ``optional``.
        doc: one line for ``trainguard rules list`` and error messages.
        optional: ``None`` (or the string ``"None"``) is a valid value.
        check: extra validation; returns an error message or None.
        documented_default: SageMaker's documented default where trainguard's calibrated one
            differs (shown in ``trainguard rules describe``; the deviation is explained in the
            rule's docstring).
    """

    def __init__(
        self,
        kind: Any,
        default: Any,
        doc: str = "",
        *,
        optional: bool = False,
        check: Callable[[Any], str | None] | None = None,
        documented_default: Any = None,
    ) -> None:
        if kind not in _PARSERS:
            raise TypeError(f"unsupported parameter kind {kind!r}")
        self.kind = kind
        self.default = default
        self.doc = doc
        self.optional = optional or default is None
        self.check = check
        self.documented_default = documented_default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return instance.__dict__.get(self.name, self.default)

    def parse(self, rule_name: str, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_STRINGS):
            if self.optional:
                return None
            raise ConfigError(f"{rule_name}: parameter {self.name} needs a value ({self.doc or self.kind})")
        try:
            parsed = _PARSERS[self.kind](value)
        except (TypeError, ValueError) as error:
            kind = getattr(self.kind, "__name__", self.kind)
            raise ConfigError(f"{rule_name}: parameter {self.name}={value!r} is not a valid {kind}: {error}") from None
        if self.check is not None:
            problem = self.check(parsed)
            if problem:
                raise ConfigError(f"{rule_name}: parameter {self.name}={value!r}: {problem}")
        return parsed


# A rule's semantics: trainguard's calibrated verdicts (trends against the run's own noise,
# persistence over a window) or SageMaker's documented single-step conditions, kept for users
# who ask for them explicitly.
CALIBRATED = "calibrated"
SAGEMAKER = "sagemaker"


def _check_semantics(value: Any) -> str | None:
    if value not in (CALIBRATED, SAGEMAKER):
        return f"must be {CALIBRATED!r} or {SAGEMAKER!r}"
    return None


def semantics_param() -> Param:
    """The ``semantics`` parameter a rule with both behaviours declares (default: calibrated)."""
    return Param(
        str,
        CALIBRATED,
        f"{CALIBRATED!r}: trends and persistence judged against the run's own noise (default); "
        f"{SAGEMAKER!r}: SageMaker's documented single-step condition",
        check=_check_semantics,
    )
