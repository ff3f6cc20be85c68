"""One HTTP(S) POST to the address the outbound policy passed, bounded in time, never redirected.

The connection goes to the exact IP that was checked, while the request keeps the URL's host name
in its ``Host`` header and, for https, in the TLS SNI and certificate check: the receiver sees an
ordinary request, and a second DNS answer cannot change where it goes. Redirects are not
followed (a 3xx is a failed delivery naming the location), so a receiver cannot bounce the POST
to an internal address either. Each attempt has one deadline for connect, send and the response
headers together: a receiver that trickles its answer is cut off at the deadline, not per byte.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from trainguard.services.actions.outbound_policy import OutboundPolicy, OutboundRefused
from trainguard.services.errors import ServiceError

__all__ = ["DeliveryError", "PostResult", "post"]


class DeliveryError(ServiceError, OSError):
    """The POST did not get an answer (connection refused or reset, timeout, TLS failure)."""


@dataclass(frozen=True)
class PostResult:
    status: int
    address: str  # the IP the request went to
    location: str = ""  # a redirect's target, reported, never followed


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, address: str, host: str, port: int, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._tls = context  # http.client keeps it too, but privately

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = raw  # the deadline's watchdog can cut a stalled handshake too
        try:
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)  # SNI and cert: the name
        except BaseException:
            raw.close()
            raise


def _abort(connection: http.client.HTTPConnection) -> None:
    """Unblock a read stuck past the deadline (shutdown wakes the thread blocked in recv)."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _target(url: str) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused(f"{url[:200]!r}: only http:// or https:// URLs with a host are allowed")
    port = parts.port or (443 if scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return scheme, parts.hostname, port, path


def post(
    url: str, body: bytes, headers: Mapping[str, str], *, policy: OutboundPolicy, timeout: float,
    tls_context: ssl.SSLContext | None = None,
) -> PostResult:  # fmt: skip
    """POST ``body`` to ``url`` through ``policy``; the answer's status (a 3xx is returned, not followed).

    Raises OutboundRefused when the policy refuses the target, DeliveryError when no answer came
    within ``timeout`` seconds (all of the addresses tried, connect to response headers).
    """
    scheme, host, port, path = _target(url)
    try:
        addresses = policy.addresses_for(host, port)
    except OSError as error:  # not OutboundRefused: a DNS fault, worth a retry
        raise DeliveryError(f"POST {url[:200]}: cannot resolve {host!r}: {error}") from None
    deadline = time.monotonic() + timeout
    errors: list[str] = []
    for address in addresses:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if scheme == "https":
            connection: http.client.HTTPConnection = _PinnedHTTPSConnection(
                address, host, port, remaining, tls_context or ssl.create_default_context()
            )
        else:
            connection = _PinnedHTTPConnection(address, host, port, remaining)
        watchdog = threading.Timer(remaining, _abort, (connection,))
        watchdog.daemon = True
        watchdog.start()
        try:
            connection.request("POST", path, body=body, headers=dict(headers))
            response = connection.getresponse()
            return PostResult(response.status, address, response.getheader("Location") or "")
        except (OSError, http.client.HTTPException) as error:
            late = time.monotonic() >= deadline
            said = "no answer within the deadline" if late else str(error) or type(error).__name__
            errors.append(f"{address}: {said}")
        finally:
            watchdog.cancel()
            connection.close()
    if not errors:
        errors.append(f"no answer within {timeout:g} s")
    raise DeliveryError(f"POST {url[:200]}: {'; '.join(errors)}")
