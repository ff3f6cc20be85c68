"""Query strings as the engine reads them, rebuilt from the parameters each operation allows.

A parameter the proxy does not know for the operation is refused (some change what an operation
does: ``link`` on a delete, ``platform`` on a create); a repeated one is refused (which copy the
engine takes is not for the client to choose); ``;`` is refused (older Go split queries on it).
Values are read as the engine reads them and forwarded in one canonical spelling; listings get the
``trainguard.job`` label filter added.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from trainguard.services.docker_proxy.container_spec import JOB_LABEL, canonical_json
from trainguard.services.docker_proxy.gojson import JsonObject, decode_json, map_of
from trainguard.services.docker_proxy.refusals import BadRequest, Refused
from trainguard.services.docker_proxy.values import as_bool, as_str_list

__all__ = ["DROP", "Param", "canonical_query", "PARAMS"]

Param = Callable[[str, str], "str | None"]  # (name, value) -> canonical value; None: accepted, not forwarded

_CONTAINER_NAME = re.compile(r"/?[a-zA-Z0-9][a-zA-Z0-9_.-]+")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_TIMESTAMP = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
_SIGNAL = re.compile(r"[A-Za-z0-9+-]{1,16}")
# A file the launcher reads out of a job container (the uploader's status): absolute, no "..".
_CONTAINER_FILE = re.compile(r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9_.-]{1,255}){1,32}")


def _bool(_: str, value: str) -> str:
    # the engine's httputils.BoolValue: anything but "", 0, no, false and none is true
    return "0" if value.strip().lower() in ("", "0", "no", "false", "none") else "1"


def _int(name: str, value: str) -> str:
    if not _INTEGER.fullmatch(value):
        raise BadRequest(f"query parameter {name}={value!r} must be an integer")
    return str(int(value))


def _matching(pattern: re.Pattern[str], what: str) -> Param:
    def read(name: str, value: str) -> str:
        if not pattern.fullmatch(value):
            raise BadRequest(f"query parameter {name}={value!r} is not {what}")
        return value

    return read


def _one_of(*allowed: str) -> Param:
    def read(name: str, value: str) -> str:
        if value not in allowed:
            raise BadRequest(f"query parameter {name}={value!r} is not one of {', '.join(allowed)}")
        return value

    return read


def _tail(name: str, value: str) -> str:
    return "all" if value == "all" else _int(name, value)


def DROP(_: str, __: str) -> None:  # noqa: N802 - a constant-like marker that is a function
    """Accepted and not forwarded: a parameter docker-py sends that the engine ignores."""
    return None


def _false_only(name: str, value: str) -> None:
    if _bool(name, value) == "1":
        raise Refused(f"query parameter {name}={value!r} is refused")
    return None


def _filters(allowed_keys: tuple[str, ...]) -> Param:
    def read(name: str, value: str) -> str:
        narrowed: dict[str, list[str]] = {}
        for key, member in map_of(decode_json(value.encode(), "filters") if value else None, name).items():
            if key not in allowed_keys:
                raise Refused(f"filter {key!r} is not one of {', '.join(allowed_keys)}")
            if isinstance(member, JsonObject):  # the map form {"a=b": true}: the engine uses every key
                entries = map_of(member, f"{name}.{key}")
                for entry, on in entries.items():
                    as_bool(on, f"{name}.{key}[{entry!r}]")
                narrowed[key] = list(entries)
            else:
                narrowed[key] = as_str_list(member, f"{name}.{key}")
        labels = narrowed.setdefault("label", [])
        if not any(label == JOB_LABEL or label.startswith(JOB_LABEL + "=") for label in labels):
            labels.append(JOB_LABEL)  # label filters are ANDed: this narrows whatever else was asked
        return canonical_json(narrowed).decode()

    return read


def canonical_query(query: str, allowed: Mapping[str, Param], forced: Mapping[str, str] | None = None) -> str:
    """The query string rebuilt from ``allowed`` parameters; ``forced`` ones are always sent."""
    if ";" in query:
        raise BadRequest("';' in the query string is refused: separate parameters with '&'")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False, errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the query string is not UTF-8 form encoding") from None
    seen: set[str] = set()
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in seen:
            raise Refused(f"query parameter {name!r} appears twice")
        seen.add(name)
        read = allowed.get(name)
        if read is None:
            raise Refused(f"query parameter {name!r} is not one the trainguard docker proxy allows here")
        canonical = read(name, value)
        if canonical is not None:
            out[name] = canonical
    for name, value in (forced or {}).items():
        if name not in out:
            out[name] = allowed[name](name, value)
    return urlencode(out)


_CONTAINER_FILTERS = _filters(("label", "name", "status", "id"))
_VOLUME_FILTERS = _filters(("label", "name", "dangling", "driver"))

# The parameters each operation accepts: what docker-py sends for the launcher's calls.
PARAMS: dict[str, dict[str, Param]] = {
    "ping": {},
    "version": {},
    "containers.list": {
        "all": _bool,
        "limit": _int,
        "size": _bool,
        "filters": _CONTAINER_FILTERS,
        "trunc_cmd": DROP,
    },  # fmt: skip
    "containers.create": {"name": _matching(_CONTAINER_NAME, "a container name")},
    "containers.inspect": {"size": _bool},
    "containers.logs": {
        "stdout": _bool,
        "stderr": _bool,
        "timestamps": _bool,
        "follow": _bool,
        "tail": _tail,
        "since": _matching(_TIMESTAMP, "a timestamp"),
        "until": _matching(_TIMESTAMP, "a timestamp"),
    },
    "containers.archive": {"path": _matching(_CONTAINER_FILE, "an absolute path without '..'")},
    "containers.start": {},
    "containers.stop": {"t": _int},
    "containers.restart": {"t": _int},
    "containers.kill": {"signal": _matching(_SIGNAL, "a signal")},
    "containers.wait": {"condition": _one_of("not-running", "next-exit", "removed")},
    "containers.remove": {"v": _bool, "force": _bool, "link": _false_only},
    "volumes.list": {"filters": _VOLUME_FILTERS},
    "volumes.create": {},
    "volumes.inspect": {},
    "volumes.remove": {"force": _bool},
    "networks.inspect": {"verbose": _bool, "scope": _one_of("local", "swarm", "global")},
    "images.inspect": {},
}
