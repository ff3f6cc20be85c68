"""``trainguard ui``'s web server: the standard library's ``ThreadingHTTPServer``, no framework.

Serves the pages and static files of :mod:`trainguard.ui` (relative links, so the same files also
work under ``trainguard serve``'s ``/ui/``) and the JSON of a :class:`~trainguard.ui.dashboard.
Dashboard`. Read-only: nothing here changes a run. Every response carries a Content-Security-
Policy allowing only this origin (no inline script, no external request), and requests whose
``Host`` is not the address served are refused, so a web page elsewhere cannot read the runs
through DNS rebinding.
"""

from __future__ import annotations

import mimetypes
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from trainguard.ui.dashboard import Dashboard
from trainguard.ui.views import dumps

__all__ = ["CONTENT_SECURITY_POLICY", "PAGES", "UiServer", "security_headers", "static_file"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PAGES = {"": "index.html", "index.html": "index.html", "run.html": "run.html", "compare.html": "compare.html"}


def security_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }


def static_file(relative: str) -> tuple[bytes, str] | None:
    """A file of the package's ``static/`` folder and its content type; None for anything else."""
    parts = [part for part in relative.split("/") if part]
    if not parts or any(part in (".", "..") or part.startswith(".") for part in parts):
        return None
    node = resources.files("trainguard.ui").joinpath("static", *parts)
    if not node.is_file():
        return None
    kind = mimetypes.guess_type(parts[-1])[0] or "application/octet-stream"
    if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
        kind += "; charset=utf-8"
    return node.read_bytes(), kind


class _Handler(BaseHTTPRequestHandler):
    server_version = "trainguard-ui"
    dashboard: Dashboard
    allowed_hosts: frozenset[str]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a polling page would print a line per second

    def _send(self, status: int, body: bytes, kind: str, *, cache: bool = False) -> None:
        self.send_response(status)
        for name, value in security_headers().items():
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, document: Any) -> None:
        self._send(status, dumps(document), "application/json; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        host = (self.headers.get("Host") or "").lower()
        if self.allowed_hosts and host not in self.allowed_hosts:
            self._json(HTTPStatus.MISDIRECTED_REQUEST, {"error": f"unexpected Host {host!r}"})
            return
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path.lstrip("/")
        query = urllib.parse.parse_qs(parsed.query)
        try:
            self._route(path, {key: values[-1] for key, values in query.items()})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _route(self, path: str, query: dict[str, str]) -> None:
        if path in PAGES:
            found = static_file(PAGES[path])
            assert found is not None, "the package's pages ship with it"
            self._send(200, *found)
            return
        if path.startswith("static/"):
            found = static_file(path[len("static/") :])
            if found is None:
                self._json(404, {"error": "not found"})
            else:
                self._send(200, *found, cache=True)
            return
        if path == "api/session":
            self._json(200, {"mode": "local", "can_stop": False, "user": None})
            return
        if path == "api/runs":
            self._json(*self.dashboard.list_runs(query.get("q", "")))
            return
        parts = path.split("/")
        if len(parts) >= 3 and parts[:2] == ["api", "runs"]:
            run_id, rest = parts[2], "/".join(parts[3:])
            if rest == "":
                self._json(*self.dashboard.detail(run_id))
                return
            if rest == "series":
                since = query.get("since")
                self._json(*self.dashboard.series(run_id, int(since) if since and since.isdigit() else None))
                return
            if rest == "histogram" and query.get("step", "").isdigit() and query.get("tensor"):
                self._json(
                    *self.dashboard.histogram(run_id, query["tensor"], int(query["step"]), query.get("worker") or None)
                )
                return
        self._json(404, {"error": "not found"})


class UiServer:
    """The dashboard on ``host:port`` (port 0: any free port); ``url`` once started."""

    def __init__(self, dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0) -> None:
        self.dashboard = dashboard
        handler: type[_Handler] = type("Handler", (_Handler,), {"dashboard": dashboard, "allowed_hosts": frozenset()})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        # --host 0.0.0.0 is an explicit choice to be reached by any name: no Host check then
        names = {host, "127.0.0.1", "localhost", "[::1]"} if host in ("127.0.0.1", "localhost", "::1") else {host}
        if host not in ("0.0.0.0", "::"):
            handler.allowed_hosts = frozenset(f"{name.lower()}:{self.port}" for name in names)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{shown}:{self.port}/"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.5)

    def start(self) -> UiServer:
        self._thread = threading.Thread(target=self.serve_forever, name="trainguard-ui", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
