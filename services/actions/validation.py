"""What an action's own fields may contain, judged when the job is created.

A webhook's URL and headers go onto an HTTP request line and into header lines, an e-mail address
into an SMTP envelope and a ``To:`` header, a phone number or topic into an SNS call: a line break
or another control character in any of them would start a new header or command there. They are
refused at creation (a 4xx naming the field), not discovered when the alarm fires.

:func:`check_action_fields` is what the API's job validation calls for every action.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

__all__ = [
    "WEBHOOK_SCHEMES",
    "check_action_fields",
    "check_email_address",
    "check_header",
    "check_no_control_characters",
    "check_webhook_url",
]

WEBHOOK_SCHEMES = ("http", "https")

# C0 controls, DEL, C1 controls and the Unicode line/paragraph separators some parsers break on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# A header value may hold a horizontal tab (RFC 9110 field-value), never another control.
_HEADER_VALUE_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# RFC 9110 token: what a header name may be made of.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# One plain address (local@domain): no display name, no list, no quoting, no spaces.
_EMAIL_ADDRESS = re.compile(r"^[^@\s<>(),;:\"\[\]\\]+@[^@\s<>(),;:\"\[\]\\]+$")
# Hop-by-hop and framing headers the sender sets itself; a caller's copy would desynchronise the body.
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer"})


def _describe(character: str) -> str:
    names = {"\r": "a carriage return", "\n": "a line feed", "\t": "a tab", "\x00": "a NUL byte"}
    return names.get(character, f"the control character U+{ord(character):04X}")


def check_no_control_characters(value: str, field: str) -> str:
    """``value`` if it holds no control character (CR, LF, NUL, other C0/C1, U+2028/9); else ValueError
    naming ``field``."""
    match = _CONTROL.search(value)
    if match:
        raise ValueError(
            f"{field}: must not contain {_describe(match.group())} (line breaks and control characters are refused)"
        )
    return value


def check_webhook_url(url: object, field: str = "url") -> str:
    """The URL if it is http(s) with a host and nothing a request line could be split on; ValueError otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"{field}: must be a string")
    check_no_control_characters(url, field)
    if " " in url:
        raise ValueError(f"{field}: must not contain spaces (percent-encode them as %20)")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() not in WEBHOOK_SCHEMES or not parsed.hostname:
        raise ValueError(f"{field} {url[:200]!r}: only http:// or https:// URLs with a host are allowed")
    if parsed.username is not None or parsed.password is not None:
        raise ValueError(f"{field}: credentials in the URL are not sent; pass them in 'headers' (Authorization)")
    try:
        parsed.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as error:
        raise ValueError(f"{field}: {error}") from None
    return url


def check_header(name: object, value: object, field: str = "headers") -> None:
    """A header a webhook may send: a token name, a value without line breaks, not one the sender sets itself."""
    if not isinstance(name, str) or not _HEADER_NAME.match(name):
        raise ValueError(f"{field}: header name {str(name)[:64]!r} is not a valid HTTP header name (RFC 9110 token)")
    if name.lower() in _RESERVED_HEADERS:
        raise ValueError(f"{field}: header {name!r} is set by the sender and may not be given")
    if not isinstance(value, str):
        raise ValueError(f"{field}[{name!r}]: must be a string")
    match = _HEADER_VALUE_CONTROL.search(value)
    if match:
        raise ValueError(f"{field}[{name!r}]: must not contain {_describe(match.group())} (line breaks are refused)")


def check_email_address(address: object, field: str = "endpoint") -> str:
    """One plain address ``local@domain``: no line break, display name, list or quoting."""
    if not isinstance(address, str):
        raise ValueError(f"{field}: must be a string")
    check_no_control_characters(address, field)
    if len(address) > 254 or not _EMAIL_ADDRESS.match(address):
        raise ValueError(f"{field}: {address[:64]!r} is not a single e-mail address (local@domain)")
    return address


def check_action_fields(action: Mapping[str, Any]) -> None:
    """Refuse an action whose fields carry line breaks or are malformed for where they are sent.

    Raises ValueError whose message starts with the field's name (``url``, ``headers[...]``,
    ``endpoint``, ...); the caller prefixes the action's position.
    """
    name = str(action.get("name") or "").lower()
    for key in ("name", "endpoint", "topic_arn", "training_job_prefix", "url"):
        value = action.get(key)
        if isinstance(value, str):
            check_no_control_characters(value, key)
    if name == "webhook":
        check_webhook_url(action.get("url"), "url")
    headers = action.get("headers")
    if headers is not None:
        if not isinstance(headers, Mapping):
            raise ValueError("headers: must be a map of header name to value")
        for header, value in headers.items():
            check_header(header, value)
    if name == "email" and action.get("endpoint") is not None:
        check_email_address(action.get("endpoint"))
