"""Authentication of the control API: who the caller is (what it may see is :mod:`.policy`'s TenancyPolicy).

* Native REST: ``Authorization: Bearer <TRAINGUARD_API_TOKEN>`` (the operator), or a request
  signed with an access key (SigV4, credential scoped to service ``trainguard``; host, x-amz-date,
  method, path, query and body signed), which acts as that key's tenant.
* Rule-runner reports: the API token or the job's own runner token (handed to its runners only).
* SageMaker endpoint (``POST /``): AWS Signature Version 4, verified. The server recomputes the
  signature with the secret of the access key id named in ``Credential=`` (pairs configured in
  TRAINGUARD_SAGEMAKER_ACCESS_KEYS / _FILE, see :mod:`trainguard.services.api.access_keys`) over the
  canonical request, including the SHA-256 of the body, and refuses: an unknown key id, a wrong
  signature, a date more than 15 minutes off the server's clock (AWS's window), a scope for another
  region or service, or a signature that does not cover ``host``, ``x-amz-date`` and
  ``x-amz-target`` (the operation). As on AWS, the same signed request may be replayed within the
  window; changing any signed part of it (body, operation, host) breaks the signature.
  ``Authorization: Bearer <TRAINGUARD_API_TOKEN>`` is accepted there too (the master credential).
  An access key id is never a bearer token: it travels in clear in every request.

Run the API behind TLS whenever the network is not trusted: the bearer token travels in a header.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

from fastapi import HTTPException, Request, status
from trainguard.services.api.policy import OPERATOR_CALLER, Caller
from trainguard.services.api.settings import Settings
from trainguard.services.errors import ServiceError

__all__ = [
    "MAX_CLOCK_SKEW",
    "NATIVE_SERVICE",
    "SigV4Error",
    "bearer_token",
    "check_bearer",
    "native_caller",
    "native_precheck",
    "sagemaker_access_key",
    "sagemaker_precheck",
    "verify_sagemaker_request",
    "verify_sigv4",
]

MAX_CLOCK_SKEW = dt.timedelta(minutes=15)  # AWS refuses requests whose X-Amz-Date is further off
SERVICE = "sagemaker"
# X-Amz-Target prefix -> the SigV4 service name its clients sign with.
_TARGET_SERVICES = {"SageMaker": "sagemaker", "Logs_20140328": "logs"}
ALGORITHM = "AWS4-HMAC-SHA256"
_REQUIRED_SIGNED = ("host", "x-amz-date", "x-amz-target")
# The native REST API (/v1) takes SigV4 too, scoped to this service; path and query are signed.
NATIVE_SERVICE = "trainguard"
_REQUIRED_SIGNED_NATIVE = ("host", "x-amz-date")
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
_AUTH_FIELDS = ("Credential", "SignedHeaders", "Signature")
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_UNSIGNED = "UNSIGNED-PAYLOAD"


class SigV4Error(ServiceError):
    """A SageMaker request whose signature does not hold. ``code`` is AWS's error code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _equal(a: str, b: str) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


def check_bearer(request: Request, settings: Settings, *also: str) -> None:
    token = bearer_token(request)
    if _equal(token, settings.api_token) or any(_equal(token, other) for other in also):
        return
    raise HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="missing or wrong bearer token: send 'Authorization: Bearer <TRAINGUARD_API_TOKEN>'",
        headers={"WWW-Authenticate": "Bearer"},
    )


def sagemaker_access_key(request: Request) -> str:
    match = _CREDENTIAL.search(request.headers.get("authorization", ""))
    return match.group(1) if match else ""


# -- SigV4 ---------------------------------------------------------------------------------------
def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), date)
    key = _hmac(key, region)
    key = _hmac(key, service)
    return _hmac(key, "aws4_request")


def _canonical_uri(raw_path: str) -> str:
    # Clients encode each path segment once (botocore: quote(normalized path, safe='/~')).
    return quote(unquote(raw_path) or "/", safe="/~")


def _canonical_query(raw_query: str) -> str:
    pairs = []
    for pair in raw_query.split("&") if raw_query else []:
        key, _, value = pair.partition("=")
        pairs.append((quote(unquote(key), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_request(
    method: str, raw_path: str, raw_query: str, headers: Iterable[tuple[str, str]], signed: list[str], payload_hash: str
) -> str:
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(" ".join(value.split()))
    lines = [f"{name}:{','.join(values[name])}" for name in signed]
    return "\n".join(
        [method.upper(), _canonical_uri(raw_path), _canonical_query(raw_query), "\n".join(lines) + "\n",
         ";".join(signed), payload_hash]  # fmt: skip
    )


def _authorization_fields(rest: str) -> dict[str, str]:
    """``Credential=..., SignedHeaders=..., Signature=...``: each exactly once, nothing else.

    A field given twice is refused rather than resolved: a parser that kept the first and one
    that kept the last would judge different signatures of one request.
    """
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, separator, value = part.strip().partition("=")
        if not separator or name not in _AUTH_FIELDS:
            shown = name[:40] if separator else part.strip()[:40]
            expected = ", ".join(_AUTH_FIELDS)
            raise SigV4Error(
                "IncompleteSignatureException", f"Authorization: unexpected field {shown!r}; expected {expected}"
            )
        if name in fields:
            raise SigV4Error("IncompleteSignatureException", f"Authorization: {name}= is given more than once")
        fields[name] = value.strip()
    return fields


def _parse_authorization(header: str) -> tuple[list[str], list[str], str]:
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SigV4Error(
            "IncompleteSignatureException", f"Authorization must use {ALGORITHM} (AWS Signature Version 4)"
        )
    fields = _authorization_fields(rest)
    missing = [name for name in _AUTH_FIELDS if not fields.get(name)]
    if missing:
        raise SigV4Error("IncompleteSignatureException", f"Authorization header lacks {', '.join(missing)}")
    scope = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise SigV4Error("IncompleteSignatureException", "Credential must be AKID/yyyymmdd/region/service/aws4_request")
    if signed != sorted(set(signed)) or any(not name or name != name.lower() for name in signed):
        raise SigV4Error("IncompleteSignatureException", "SignedHeaders must be lowercase, sorted and unique")
    if not re.fullmatch(r"[0-9a-f]{64}", fields["Signature"]):
        raise SigV4Error("IncompleteSignatureException", "Signature must be 64 lowercase hex digits")
    return scope, signed, fields["Signature"]


def verify_sigv4(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
    settings: Settings,
    now: dt.datetime | None = None,
    service: str | None = None,
) -> str:
    """Check a SigV4-signed request; returns the access key's name, raises :class:`SigV4Error`.

    ``body=None`` checks everything that does not need the body (key, scope, date, signed headers)
    so a request can be refused before its body is read; the signature itself needs the body.
    ``service``: the service the credential must be scoped to; None (the SageMaker endpoint) takes
    it from the operation in X-Amz-Target, which must then be signed too.
    """
    header_map: dict[str, str] = {}
    for name, value in headers:
        header_map.setdefault(name.lower(), value)
    if sum(1 for name, _ in headers if name.lower() == "authorization") > 1:
        raise SigV4Error("IncompleteSignatureException", "the request has more than one Authorization header")
    scope, signed, signature = _parse_authorization(header_map.get("authorization", ""))
    key_id, date, region, scoped_service = scope[:4]
    key = settings.sagemaker_keys.lookup(key_id)
    if key is None:
        raise SigV4Error("UnrecognizedClientException", "The security token included in the request is invalid.")
    # The credential's service must be the one the operation belongs to (SageMaker.* -> sagemaker,
    # Logs_20140328.* -> logs): a signature for one service is never accepted for another.
    expected_service = service or _TARGET_SERVICES.get(header_map.get("x-amz-target", "").partition(".")[0], SERVICE)
    required_signed = _REQUIRED_SIGNED if service is None else _REQUIRED_SIGNED_NATIVE
    if scoped_service != expected_service:
        raise SigV4Error(
            "InvalidSignatureException", f"Credential should be scoped to correct service: '{expected_service}'."
        )
    if region != settings.region:
        raise SigV4Error(
            "InvalidSignatureException", f"Credential should be scoped to a valid region, not '{region}'. "
            f"This endpoint serves '{settings.region}'."
        )
    not_signed = [name for name in required_signed if name not in signed]
    if not_signed:
        raise SigV4Error("IncompleteSignatureException", f"SignedHeaders must include {', '.join(not_signed)}")
    absent = [name for name in signed if name not in header_map]
    if absent:
        raise SigV4Error(
            "IncompleteSignatureException", f"signed header(s) {', '.join(absent)} missing from the request"
        )
    amz_date = header_map["x-amz-date"]
    try:
        when = dt.datetime.strptime(amz_date, _AMZ_DATE).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise SigV4Error("IncompleteSignatureException", f"X-Amz-Date {amz_date!r} is not yyyymmddThhmmssZ") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    if abs(now - when) > MAX_CLOCK_SKEW:
        raise SigV4Error(
            "InvalidSignatureException",
            f"Signature expired: {amz_date} is now earlier than or later than {now.strftime(_AMZ_DATE)} "
            "by more than 15 minutes.",
        )
    if date != amz_date[:8]:
        raise SigV4Error("InvalidSignatureException", "the Credential date does not match X-Amz-Date")
    if body is None:
        return key.name
    body_hash = hashlib.sha256(body).hexdigest()
    claimed = header_map.get("x-amz-content-sha256")
    if claimed is not None and claimed != body_hash:
        # UNSIGNED-PAYLOAD included: an unsigned body could be swapped by anyone replaying the request.
        raise SigV4Error(
            "InvalidSignatureException", "X-Amz-Content-SHA256 does not match the body (signed payload required)"
        )
    string_to_sign = "\n".join(
        [ALGORITHM, amz_date, "/".join(scope[1:]),
         hashlib.sha256(
             canonical_request(method, raw_path, raw_query, headers, signed, body_hash).encode()
         ).hexdigest()]
    )  # fmt: skip
    key_bytes = signing_key(key.secret, date, region, scoped_service)
    expected = hmac.new(key_bytes, string_to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SigV4Error(
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return key.name


def _request_parts(request: Request) -> dict:
    scope = request.scope
    raw_path = scope.get("raw_path")
    return {
        "method": request.method,
        "raw_path": raw_path.decode("latin-1") if raw_path else scope.get("path", "/"),
        "raw_query": (scope.get("query_string") or b"").decode("latin-1"),
        "headers": [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])],
        "settings": request.app.state.settings,
    }


def sagemaker_precheck(request: Request) -> bool:
    """True for the master bearer token; else checks what SigV4 allows before the body (raises SigV4Error).

    Returns False when a SigV4 signature must still be verified over the body with
    :func:`verify_sagemaker_request`.
    """
    settings: Settings = request.app.state.settings
    if _equal(bearer_token(request), settings.api_token):
        return True
    if not request.headers.get("authorization"):
        raise SigV4Error(
            "MissingAuthenticationTokenException", "Missing Authentication Token: sign the request with SigV4"
        )
    verify_sigv4(body=None, **_request_parts(request))
    return False


def verify_sagemaker_request(request: Request, body: bytes) -> Caller:
    """The full check of a SageMaker request over its body; returns who signed it, raises SigV4Error."""
    settings: Settings = request.app.state.settings
    if _equal(bearer_token(request), settings.api_token):
        return OPERATOR_CALLER
    if not request.headers.get("authorization"):
        raise SigV4Error(
            "MissingAuthenticationTokenException", "Missing Authentication Token: sign the request with SigV4"
        )
    return Caller(verify_sigv4(body=body, **_request_parts(request)))


# -- the native REST API: the operator's bearer token, or a key's SigV4 signature ----------------------
def _unauthorized() -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail="missing or wrong credentials: send 'Authorization: Bearer <TRAINGUARD_API_TOKEN>' or sign the "
        f"request with an access key (SigV4, service '{NATIVE_SERVICE}')",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _refused_signature(error: SigV4Error) -> HTTPException:
    return HTTPException(status_code=status.HTTP_403_FORBIDDEN, detail=f"{error.code}: {error.message}")


def _signed(request: Request) -> bool:
    return request.headers.get("authorization", "").startswith(ALGORITHM + " ")


def native_precheck(request: Request) -> None:
    """What can be checked from the headers (raises HTTPException 401/403); the signature needs the body."""
    settings: Settings = request.app.state.settings
    if _equal(bearer_token(request), settings.api_token):
        return
    if not _signed(request):
        raise _unauthorized()
    try:
        verify_sigv4(body=None, service=NATIVE_SERVICE, **_request_parts(request))
    except SigV4Error as error:
        raise _refused_signature(error) from None


async def native_caller(request: Request) -> Caller:
    """Who sent a native request: the operator (API token) or the access key whose SigV4 signature holds."""
    settings: Settings = request.app.state.settings
    if _equal(bearer_token(request), settings.api_token):
        return OPERATOR_CALLER
    if not _signed(request):
        raise _unauthorized()
    body = await request.body()
    try:
        return Caller(verify_sigv4(body=body, service=NATIVE_SERVICE, **_request_parts(request)))
    except SigV4Error as error:
        raise _refused_signature(error) from None
