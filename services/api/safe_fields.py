"""Field types shared by the API's request models: text a process and a database can take, and
free-form documents checked the same way (schemas.py: job specs; rule_reports.py: runner reports)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from annotated_types import GroupedMetadata
from pydantic import AfterValidator, StringConstraints
from trainguard.services.api.sagemaker_validation import unsafe_text

__all__ = ["MAX_STEP", "SafeText", "safe_text", "safe_tree"]

MAX_STEP = 2**62  # a step no database column or JSON reader of ours loses precision on


def safe_text(value: str) -> str:
    problem = unsafe_text(value)
    if problem:
        raise ValueError(f"must {problem}")
    return value


def safe_tree(value: Any, path: str = "", *, finite: bool = True) -> Any:
    """NUL bytes and lone surrogates in free-form documents (hook config, actions) are refused too.

    ``finite=False`` lets NaN and infinities through: a finding's details report them (a loss that
    became NaN is the finding), while a configuration value never may be one.
    """
    if isinstance(value, str):
        problem = unsafe_text(value)
        if problem:
            raise ValueError(f"{path or 'value'}: must {problem}")
    elif isinstance(value, dict):
        for key, item in value.items():
            safe_tree(key, f"{path}.{key!r}" if path else repr(key), finite=finite)
            safe_tree(item, f"{path}.{key}" if path else str(key), finite=finite)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            safe_tree(item, f"{path}[{index}]", finite=finite)
    elif finite and isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path or 'value'}: must be a finite number")
    return value


@dataclass(frozen=True)
class SafeText(GroupedMetadata):
    """``Annotated[str, SafeText(max_length, ...)]``: a string of bounded length that a process and a
    database can take (no NUL, valid Unicode). Grouped metadata, so pydantic applies both parts and
    a type checker sees a plain ``str``."""

    max_length: int
    min_length: int = 0
    pattern: str | None = None

    def __iter__(self) -> Iterator[Any]:
        yield StringConstraints(min_length=self.min_length, max_length=self.max_length, pattern=self.pattern)
        yield AfterValidator(safe_text)
