"""Why the proxy does not forward a request: each error carries the HTTP status it is answered with."""

from __future__ import annotations

from trainguard.services.errors import ServiceError

__all__ = ["BadRequest", "EngineUnavailable", "Missing", "Refused"]


class Refused(ServiceError):
    """The proxy refuses a request; the message says why (docker clients show it as the error)."""

    status = 403


class BadRequest(Refused):
    """The request is malformed (not JSON, a member of the wrong type, ...): answered 400."""

    status = 400


class Missing(Refused):
    """The object does not exist: answered 404 as the engine would, so clients see NotFound."""

    status = 404


class EngineUnavailable(Refused):
    """The proxy could not ask the engine what it needed to judge the request: answered 502."""

    status = 502
