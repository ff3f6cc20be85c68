"""The request guard: who is asking is checked before the body is read, and the body is bounded.

A pure ASGI middleware in front of every route:

1. **Authentication from the headers alone**, before a byte of the body is read: the native API
   wants the bearer token or an access key's SigV4 header checks (the internal rule-status route
   the bearer token or the job's runner token, never an access key); the
   SageMaker endpoint gets SigV4's header checks (key, scope, date; the signature itself covers the
   body and is verified by the route once the bounded body is in). An unauthenticated 100 MB upload
   is answered 401/403 at once and never buffered.
2. **A body limit** (TRAINGUARD_MAX_BODY_BYTES, default 1 MiB): a declared ``Content-Length`` over
   it is a 413 at once; a chunked body is read here, at most limit + 1 bytes, then replayed to the
   route, so no route ever holds more than the limit in memory.

``/health``, ``/docs``, ``/redoc`` and ``/openapi.json`` are public (they carry no job data).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.errors import ConfigError

__all__ = ["DEFAULT_MAX_BODY_BYTES", "RequestGuard", "max_body_bytes"]

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
PUBLIC_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
_INTERNAL = re.compile(r"^/v1/internal/jobs/([^/]+)/")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def max_body_bytes(settings: Any, environ: dict[str, str]) -> int:
    """The limit: the settings' ``max_body_bytes`` when they have one, else TRAINGUARD_MAX_BODY_BYTES."""
    value = getattr(settings, "max_body_bytes", None)
    if value is None:
        raw = (environ.get("TRAINGUARD_MAX_BODY_BYTES") or "").strip()
        if not raw:
            return DEFAULT_MAX_BODY_BYTES
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"TRAINGUARD_MAX_BODY_BYTES={raw!r} is not a whole number of bytes") from None
    if not 1024 <= int(value) <= 1024**3:
        raise ConfigError(f"TRAINGUARD_MAX_BODY_BYTES={value}: use 1024 to 1073741824 bytes")
    return int(value)


async def _answer(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None,
                  media_type: str = "application/json") -> None:  # fmt: skip
    payload = json.dumps(body).encode()
    raw_headers = [(b"content-type", media_type.encode()), (b"content-length", str(len(payload)).encode()),
                   (b"connection", b"close")]  # fmt: skip
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(scope)
        if refusal is not None:
            await refusal(send)
            return
        declared = self._content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._too_large(scope, send)
            return
        if declared is None and scope["method"] not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            body = await self._read_bounded(receive)
            if body is None:
                await self._too_large(scope, send)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    # -- authentication from headers ----------------------------------------------------------------
    async def _refusal(self, scope: Scope) -> Callable[[Send], Awaitable[None]] | None:
        path = scope["path"]
        if path in PUBLIC_PATHS:
            return None
        request = Request(scope)
        if path == "/" and scope["method"] == "POST":
            return self._sagemaker_refusal(request)
        if not path.startswith("/v1/"):
            return None  # no route there: the router answers 404/405 without reading a body
        from trainguard.services.api.auth import check_bearer, native_precheck

        settings = scope["app"].state.settings
        try:
            if path.startswith("/v1/internal/"):  # rule runners: the API or the job's runner token, never a key
                internal = _INTERNAL.match(path)
                also = await run_in_threadpool(self._runner_token, scope, internal.group(1)) if internal else ()
                check_bearer(request, settings, *also)
            else:
                native_precheck(request)
        except HTTPException as error:
            detail, headers, status = error.detail, dict(error.headers or {}), error.status_code
            return lambda send: _answer(send, status, {"detail": detail}, headers)
        return None

    @staticmethod
    def _runner_token(scope: Scope, name: str) -> tuple[str, ...]:
        from trainguard.services.api.jobs import JobNotFound

        if not _JOB_NAME.match(name):
            return ()  # no job has this name: never send it to the database (a NUL breaks Postgres)
        try:
            return (scope["app"].state.service.runner_token(name),)
        except JobNotFound:
            return ()

    @staticmethod
    def _sagemaker_refusal(request: Request) -> Callable[[Send], Awaitable[None]] | None:
        from trainguard.services.api import auth

        precheck = getattr(auth, "sagemaker_precheck", None)
        if precheck is None:
            return None  # an auth module without header checks: the route decides
        try:
            precheck(request)
        except auth.SigV4Error as error:
            body = {"__type": error.code, "message": error.message}
            return lambda send: _answer(send, 403, body, media_type="application/x-amz-json-1.1")
        return None

    # -- the body limit -----------------------------------------------------------------------------
    @staticmethod
    def _content_length(scope: Scope) -> int | None:
        for key, value in scope.get("headers") or ():
            if key == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return None  # the server (h11/httptools) refuses a malformed length itself
        return None

    async def _read_bounded(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        message = f"the request body exceeds {self.max_body_bytes} bytes (TRAINGUARD_MAX_BODY_BYTES)"
        if scope["path"] == "/":
            await _answer(send, 413, {"__type": "ValidationException", "message": message},
                          media_type="application/x-amz-json-1.1")  # fmt: skip
        else:
            await _answer(send, 413, {"detail": message})


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server would

    return replayed
