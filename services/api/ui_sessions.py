"""Browser sessions of the dashboard at ``/ui/``: browsers cannot sign requests with SigV4.

A caller logs in once, with an access key pair (the same pairs as the SageMaker endpoint and the
native API) or the operator's API token, or through the one-time login URL ``trainguard serve``
prints; the answer sets an ``HttpOnly; SameSite=Strict`` cookie holding a random session id. The
server keeps, per session, the caller, a digest of the credential it was opened with, its expiry
and a CSRF token. Every request checks that the credential is still configured unchanged: a key
revoked (or its secret rotated) ends its sessions at once. Sessions live in memory: a restart of
the API logs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from trainguard.services.api.policy import OPERATOR_CALLER, Caller
from trainguard.services.api.settings import Settings

__all__ = ["SESSION_COOKIE", "SESSION_SECONDS", "UiSession", "UiSessions"]

SESSION_COOKIE = "tg_ui_session"
SESSION_SECONDS = 8 * 3600
ONE_TIME_SECONDS = 600
_MAX_SESSIONS = 10_000


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class UiSession:
    caller: Caller
    key_id: str  # "" for the operator (the API token)
    credential_digest: str
    expires: float
    csrf: str


class UiSessions:
    """Open sessions and one-time login tokens (thread-safe, in memory, bounded)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sessions: dict[str, UiSession] = {}
        self._once: dict[str, float] = {}
        self._lock = threading.Lock()

    # -- credentials -----------------------------------------------------------------------------
    def caller_for_key(self, key_id: str, secret: str) -> tuple[Caller, str] | None:
        key = self.settings.sagemaker_keys.lookup(key_id)
        if key is None or not hmac.compare_digest(key.secret.encode(), secret.encode()):
            return None
        return Caller(key.name), key_id

    def caller_for_token(self, token: str) -> tuple[Caller, str] | None:
        expected = self.settings.api_token
        if not expected or not token or not hmac.compare_digest(expected.encode(), token.encode()):
            return None
        return OPERATOR_CALLER, ""

    def _credential_digest(self, key_id: str) -> str | None:
        """What the session's credential is now (None: revoked)."""
        if not key_id:
            return _digest(self.settings.api_token) if self.settings.api_token else None
        key = self.settings.sagemaker_keys.lookup(key_id)
        return _digest(key.secret) if key is not None else None

    # -- sessions ----------------------------------------------------------------------------------
    def open(self, caller: Caller, key_id: str) -> tuple[str, UiSession]:
        digest = self._credential_digest(key_id)
        assert digest is not None, "open a session only for a credential just checked"
        session = UiSession(caller, key_id, digest, time.time() + SESSION_SECONDS, secrets.token_urlsafe(32))
        token = secrets.token_urlsafe(32)
        with self._lock:
            now = time.time()
            if len(self._sessions) >= _MAX_SESSIONS:
                self._sessions = {k: v for k, v in self._sessions.items() if v.expires > now}
                while len(self._sessions) >= _MAX_SESSIONS:  # still full: the oldest go first
                    self._sessions.pop(next(iter(self._sessions)))
            self._sessions[token] = session
        return token, session

    def get(self, token: str | None) -> UiSession | None:
        if not token:
            return None
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return None
            current = self._credential_digest(session.key_id)
            if (
                session.expires < time.time()
                or current is None
                or not hmac.compare_digest(current, session.credential_digest)
            ):
                self._sessions.pop(token, None)  # expired, or its key was revoked or rotated
                return None
            return session

    def close(self, token: str | None) -> None:
        with self._lock:
            self._sessions.pop(token or "", None)

    # -- the one-time login URL ------------------------------------------------------------------
    def one_time_token(self) -> str:
        """A token that opens one operator session within ten minutes (printed by ``serve``)."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            now = time.time()
            self._once = {k: v for k, v in self._once.items() if v > now}
            self._once[token] = now + ONE_TIME_SECONDS
        return token

    def redeem(self, token: str) -> bool:
        with self._lock:
            expires = self._once.pop(token, None)
        return expires is not None and expires > time.time()
