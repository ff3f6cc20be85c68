"""Real local servers the action tests deliver to: an HTTP server recording POSTs, an SMTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RecordingHttpServer:
    """Records every POST body (JSON); answers ``fail_first`` requests with 503 first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[dict[str, Any]] = []
        self.attempts = 0
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.attempts += 1
                if outer.attempts <= outer.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.received.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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
