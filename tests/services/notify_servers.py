"""Real local servers the action tests deliver to: an HTTP server recording POSTs, an SMTP server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _DualStackHTTPServer(ThreadingHTTPServer):
    """Listens on [::] for IPv6 and IPv4 alike: every local address of the machine reaches it."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class RecordingHttpServer:
    """Records every POST body (JSON); answers ``fail_first`` requests with 503 first.

    ``host="::"`` listens on every local address (IPv4 and IPv6), so a test can show that a request
    to any of them never arrived. ``delay`` seconds pass before each answer (a slow receiver);
    ``redirect_to`` answers every POST with a 307 to that URL.
    """

    def __init__(self, fail_first: int = 0, *, host: str = "127.0.0.1", delay: float = 0.0, redirect_to: str = "") -> None:
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.attempts += 1
                if delay:
                    time.sleep(delay)
                if redirect_to:
                    self.send_response(307)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if outer.attempts <= outer.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.received.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server_class = _DualStackHTTPServer if ":" in host else ThreadingHTTPServer
        self.server = server_class((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = self.url_at("127.0.0.1" if host in ("::", "0.0.0.0") else host)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url_at(self, address: str, path: str = "/hook") -> str:
        """This server's URL through ``address`` (an IP, an IPv6 literal, or a host name)."""
        netloc = f"[{address}]" if ":" in address else address
        return f"http://{netloc}:{self.port}{path}"

    def __enter__(self) -> RecordingHttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingSmtpServer:
    """aiosmtpd's real SMTP server on a free port, keeping every message it accepts."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        from tests.s3_server import free_port

        self.messages: list[dict[str, Any]] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's naming
                outer.messages.append(
                    {
                        "from": envelope.mail_from,
                        "to": list(envelope.rcpt_tos),
                        "data": envelope.content.decode(errors="replace"),
                    }
                )
                return "250 Message accepted for delivery"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> RecordingSmtpServer:
        self.controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.controller.stop()
