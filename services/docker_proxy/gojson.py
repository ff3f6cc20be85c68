"""JSON as the engine's Go decoder reads it, so the proxy judges the request the engine would see.

Go's ``encoding/json`` matches an object key to a struct field ignoring case, with Unicode simple
case folding: besides ASCII letters, ``ſ`` (U+017F) folds to ``S`` and ``K`` (U+212A, Kelvin sign)
to ``K``; no other non-ASCII character folds onto an ASCII letter. Map keys (``Labels``,
``Volumes``...) are compared exactly. A key that Go would map onto a field under another spelling
is refused here rather than re-spelled, and so is a key that names no field the proxy knows: the
proxy forwards a body it rebuilt from the fields it judged, never the client's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from trainguard.services.docker_proxy.refusals import BadRequest, Refused

__all__ = ["JsonObject", "decode_json", "decode_object", "fields_of", "go_fold", "map_of"]

# The only non-ASCII runes whose simple case fold orbit holds an ASCII letter (Go's unicode tables:
# "KkK" and "Ssſ"; İ and ı have upper/lower mappings but no case fold).
_FOLDS_TO_ASCII = {"\u017f": "S", "\u212a": "K"}


@dataclass(frozen=True)
class JsonObject:
    """A JSON object as its (key, value) pairs in order, duplicates kept: the schema decides how keys
    compare (struct fields fold, map keys do not)."""

    pairs: tuple[tuple[str, Any], ...]


def go_fold(key: str) -> str | None:
    """The key folded as Go compares it with an ASCII field name; None when no ASCII name can match."""
    folded = []
    for char in key:
        if char < "\x80":
            folded.append(char.upper() if "a" <= char <= "z" else char)
        elif char in _FOLDS_TO_ASCII:
            folded.append(_FOLDS_TO_ASCII[char])
        else:
            return None
    return "".join(folded)


def _refuse_constant(name: str) -> None:
    raise BadRequest(f"the request body holds {name}, which is not JSON")


def decode_json(body: bytes, where: str = "the request body") -> Any:
    """Parse strict UTF-8 JSON (no BOM, no NaN, nothing after the value) into Python values with
    objects as :class:`JsonObject`."""
    if body.startswith(b"\xef\xbb\xbf"):
        raise BadRequest(f"{where} starts with a byte order mark; send plain UTF-8 JSON")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{where} is not UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: JsonObject(tuple(pairs)),
                          parse_constant=_refuse_constant)  # fmt: skip
    except RecursionError:
        raise BadRequest(f"{where} is nested too deeply") from None
    except ValueError as error:
        raise BadRequest(f"{where} is not JSON ({error})") from None


def decode_object(body: bytes, where: str = "the request body") -> JsonObject:
    """A request body that must be one JSON object (``null``, a list or a string is refused)."""
    value = decode_json(body, where)
    if not isinstance(value, JsonObject):
        raise BadRequest(f"{where} must be a JSON object")
    return value


def fields_of(value: Any, known: Collection[str], where: str) -> dict[str, Any]:
    """A JSON object read as a Go struct with the fields ``known``: {field: value}, nulls dropped.

    Refused: a value that is not an object, two keys Go would read as one field, a key spelled
    differently from the field Go would map it to, and a key that is no known field.
    """
    if value is None:
        return {}
    if not isinstance(value, JsonObject):
        raise BadRequest(f"{where} must be a JSON object")
    by_fold = {go_fold(name): name for name in known}
    seen: dict[str, str] = {}
    fields: dict[str, Any] = {}
    for key, member in value.pairs:
        folded = go_fold(key)
        identity = key if folded is None else folded
        if identity in seen:
            raise Refused(f"{where}: field {key!r} appears twice ({seen[identity]!r} before it; "
                          "the engine compares field names ignoring case)")  # fmt: skip
        seen[identity] = key
        field = by_fold.get(folded) if folded is not None else None
        if field is None:
            raise Refused(f"{where}.{key} is not a field the trainguard docker proxy allows")
        if key != field:
            raise Refused(f"{where}: field {key!r} is read by the engine as {field!r}: spell it {field!r}")
        if member is not None:  # Go leaves a field that is null at its zero value
            fields[field] = member
    return fields


def map_of(value: Any, where: str) -> dict[str, Any]:
    """A JSON object read as a Go map: keys compared exactly, a repeated key refused."""
    if value is None:
        return {}
    if not isinstance(value, JsonObject):
        raise BadRequest(f"{where} must be a JSON object")
    result: dict[str, Any] = {}
    for key, member in value.pairs:
        if key in result:
            raise Refused(f"{where}: key {key!r} appears twice")
        result[key] = member
    return result
