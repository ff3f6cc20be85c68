"""Token authentication.

* Native REST: ``Authorization: Bearer <TRAINGUARD_API_TOKEN>``.
* Rule-runner reports: the API token or the job's own runner token (handed to its runners only).
* SageMaker endpoint: boto3 signs with SigV4. The signature is NOT verified; the access key id in
  the ``Credential=`` part must be the API token or one of TRAINGUARD_SAGEMAKER_ACCESS_KEYS
  (``AWS_ACCESS_KEY_ID=$TRAINGUARD_API_TOKEN`` on the client side, any secret key). With
  TRAINGUARD_SAGEMAKER_ALLOW_ANY_SIGNATURE=1 any signed request is accepted (local use only).
  Run the API behind TLS whenever the network is not trusted: tokens travel in headers.
"""

from __future__ import annotations

import hmac
import re

from fastapi import HTTPException, Request, status

from trainguard.services.api.settings import Settings

__all__ = ["bearer_token", "check_bearer", "sagemaker_access_key", "sagemaker_allowed"]

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


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


def sagemaker_allowed(request: Request, settings: Settings) -> bool:
    if _equal(bearer_token(request), settings.api_token):
        return True
    key = sagemaker_access_key(request)
    if not key:
        return False
    if settings.sagemaker_allow_any_signature:
        return True
    return _equal(key, settings.api_token) or any(_equal(key, allowed) for allowed in settings.sagemaker_access_keys)
