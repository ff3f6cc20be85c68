"""The proxy's HTTP side: accept Docker API requests on TCP, forward the allowed ones to the socket.

Standard library only (it runs in the service image next to nothing else). Responses are streamed
back as they come (``logs``/``wait`` can take a while); hijacked connections (attach, exec) are
never needed by the launcher and never allowed.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import socket
from typing import Any
from urllib.parse import quote

from trainguard.services.docker_proxy.rules import JOB_LABEL, Missing, ProxyPolicy, Refused, is_root_user, parse_body

__all__ = ["DockerProxy", "UnixHTTPConnection"]

log = logging.getLogger("trainguard.docker_proxy")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host"}
MAX_BODY_BYTES = 1 << 20  # a container spec is a few KiB


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float | None = None) -> None:
        super().__init__("docker", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DockerProxy

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.client_address[0], *args)

    def _refuse(self, status: int, message: str) -> None:
        body = json.dumps({"message": f"trainguard docker proxy: {message}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send a Content-Length, not a chunked body")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._refuse(413, f"request body over {MAX_BODY_BYTES} bytes")
            return
        body = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        try:
            route = self.server.policy.route(self.command, path, query, body)
            if route.labelled_container:
                self.server.require_label("containers", route.labelled_container)
            if route.labelled_volume:
                self.server.require_label("volumes", route.labelled_volume)
            if route.creates_container and self.server.policy.refuse_root:
                self.server.check_user(parse_body(body))
        except Refused as refusal:
            log.warning("refused %s %s: %s", self.command, path, refusal)
            self._refuse(refusal.status, str(refusal))
            return
        self._forward(route.path, body)

    def _forward(self, path: str, body: bytes) -> None:
        upstream = self.server.connect()
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Host"] = "docker"
            upstream.request(self.command, path, body=body or None, headers=headers)
            response = upstream.getresponse()
            self.send_response(response.status, response.reason)
            length = response.getheader("Content-Length")
            for name, value in response.getheaders():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            if self.command == "HEAD" or response.status in (204, 304):
                self.send_header("Content-Length", "0" if length is None else length)
                self.end_headers()
                return
            if length is not None:
                self.send_header("Content-Length", length)
                self.end_headers()
                while chunk := response.read(65536):
                    self.wfile.write(chunk)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while chunk := response.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            upstream.close()

    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _handle


class DockerProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], socket_path: str, policy: ProxyPolicy) -> None:
        super().__init__(address, _Handler)
        self.socket_path = socket_path
        self.policy = policy

    def connect(self, timeout: float | None = None) -> UnixHTTPConnection:
        return UnixHTTPConnection(self.socket_path, timeout=timeout)

    def check_user(self, spec: dict[str, Any]) -> None:
        """Refuse a container that would run as root: its User, else its image's default user."""
        user = str(spec.get("User") or "")
        if not user:
            image = str(spec.get("Image") or "")
            connection = self.connect(timeout=30)
            try:
                connection.request("GET", f"/images/{quote(image, safe='')}/json")
                response = connection.getresponse()
                raw = response.read()
            finally:
                connection.close()
            if response.status == 404:
                raise Missing(f"No such image: {image}")
            if response.status != 200:
                raise Refused(f"cannot inspect image {image!r} to check its user")
            user = str((json.loads(raw).get("Config") or {}).get("User") or "")
        if is_root_user(user):
            raise Refused(
                f"the container would run as root (user {user or 'unset'!r}): give it a non-root user "
                "(TRAINGUARD_JOB_USER, or USER in the image)"
            )

    def require_label(self, collection: str, object_id: str) -> None:
        """Refuse unless the container/volume exists and carries the job label."""
        connection = self.connect(timeout=30)
        try:
            suffix = "/json" if collection == "containers" else ""
            connection.request("GET", f"/{collection}/{quote(object_id, safe='')}{suffix}")
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        if response.status == 404:
            raise Missing(f"no such {collection[:-1]}: {object_id}")
        if response.status != 200:
            raise Refused(f"no such {collection[:-1]} {object_id!r} (or not one of trainguard's)")
        info = json.loads(raw)
        labels = (info.get("Config") or {}).get("Labels") if collection == "containers" else info.get("Labels")
        if not (labels or {}).get(JOB_LABEL):
            raise Refused(f"{collection[:-1]} {object_id!r} is not one of trainguard's (no {JOB_LABEL} label)")
