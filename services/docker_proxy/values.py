"""Typed reads of decoded JSON members, refusing what Go's decoder would refuse or read differently."""

from __future__ import annotations

import re
from typing import Any

from trainguard.services.docker_proxy.gojson import JsonObject, map_of
from trainguard.services.docker_proxy.refusals import BadRequest

__all__ = ["as_bool", "as_int", "as_str", "as_str_list", "as_str_map", "as_strslice"]

_INT64 = (-(2**63), 2**63 - 1)


def as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{where} must be true or false")
    return value


def as_int(value: Any, where: str, low: int = _INT64[0], high: int = _INT64[1]) -> int:
    # JSON 1.0 and 1e3 are floats here and errors for Go's int64: both refuse them
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{where} must be an integer")
    if not low <= value <= high:
        raise BadRequest(f"{where} must be between {low} and {high}")
    return value


def as_str(value: Any, where: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    if "\x00" in value:
        raise BadRequest(f"{where} holds a NUL character")
    if pattern is not None and not pattern.fullmatch(value):
        raise BadRequest(f"{where} {value!r} is not {what or 'allowed'}")
    return value


def as_str_list(value: Any, where: str) -> list[str]:
    if isinstance(value, JsonObject) or not isinstance(value, list):
        raise BadRequest(f"{where} must be a list of strings")
    return [as_str(item, f"{where}[{index}]") for index, item in enumerate(value)]


def as_strslice(value: Any, where: str) -> list[str]:
    """Go's strslice.StrSlice (Cmd, Entrypoint, CapAdd, CapDrop): a list of strings or one string."""
    return [as_str(value, where)] if isinstance(value, str) else as_str_list(value, where)


def as_str_map(value: Any, where: str) -> dict[str, str]:
    return {as_str(key, f"{where} key"): as_str(member, f"{where}[{key!r}]")
            for key, member in map_of(value, where).items()}  # fmt: skip
