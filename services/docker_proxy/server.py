"""The proxy's HTTP side: accept Docker API requests on TCP, forward the judged ones to the socket.

Standard library only (it runs in the service image next to nothing else). Each allowed request is
sent upstream as a new request on a new connection, built from the route: the canonical path and
query, the rebuilt body, and the proxy's own headers; nothing of the client's framing reaches the
engine. Request framing is strict: no ``Transfer-Encoding`` (so a ``Content-Length`` +
``Transfer-Encoding`` pair cannot be read two ways), one plain decimal ``Content-Length``, JSON
bodies only. Responses are streamed back as they come (``logs``/``wait`` can take a while);
hijacked connections (attach, exec) are never needed by the launcher and never allowed.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import re
import socket
from typing import Any
from urllib.parse import quote

from trainguard.services.docker_proxy.container_spec import JOB_LABEL, ContainerPlan
from trainguard.services.docker_proxy.refusals import EngineUnavailable, Missing, Refused
from trainguard.services.docker_proxy.rules import ProxyPolicy, Route
from trainguard.services.docker_proxy.users import parse_user

__all__ = ["DockerProxy", "UnixHTTPConnection"]

log = logging.getLogger("trainguard.docker_proxy")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host"}
MAX_BODY_BYTES = 1 << 20  # a container spec is a few KiB
_CONTENT_LENGTH = re.compile(r"[0-9]{1,9}")
_JSON_TYPE = re.compile(r"application/json\s*(;\s*charset\s*=\s*\"?utf-8\"?\s*)?", re.IGNORECASE)


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

    def _refuse(self, status: int, message: str, close: bool = False) -> None:
        body = json.dumps({"message": f"trainguard docker proxy: {message}"}).encode()
        if close:  # the rest of the stream cannot be trusted to start at a request
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes | None:
        """The request body, or None after answering a request whose framing is refused."""
        if self.headers.get_all("Transfer-Encoding"):
            self._refuse(411, "send a Content-Length, not a Transfer-Encoding", close=True)
            return None
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not _CONTENT_LENGTH.fullmatch(lengths[0])):
            self._refuse(400, "give one Content-Length, a plain decimal number", close=True)
            return None
        length = int(lengths[0]) if lengths else 0
        if length > MAX_BODY_BYTES:
            self._refuse(413, f"request body over {MAX_BODY_BYTES} bytes", close=True)
            return None
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            self.close_connection = True
            return None
        if body and not _JSON_TYPE.fullmatch(self.headers.get("Content-Type") or ""):
            self._refuse(415, "a request body must be Content-Type: application/json (UTF-8)")
            return None
        return body

    def _handle(self) -> None:
        body = self._body()
        if body is None:
            return
        path, _, query = self.path.partition("?")
        try:
            route = self.server.policy.route(self.command, path, query, body)
            forwarded_body = route.body
            if route.labelled_container:
                route = route.on(self.server.require_label("containers", route.labelled_container))
            elif route.labelled_volume:
                route = route.on(self.server.require_label("volumes", route.labelled_volume))
            elif route.container is not None:
                forwarded_body = self.server.check_container(route.container)
        except Refused as refusal:
            log.warning("refused %s %s: %s", self.command, path, refusal)
            self._refuse(refusal.status, str(refusal))
            return
        except Exception as error:  # noqa: BLE001 - a fault of the proxy: said so, never forwarded
            log.exception("could not judge %s %s", self.command, path)
            self._refuse(500, f"the proxy could not judge this request ({type(error).__name__}); see its log")
            return
        self._forward(route, forwarded_body)

    def _forward(self, route: Route, body: bytes | None) -> None:
        upstream = self.server.connect()
        try:
            headers = {"Host": "docker"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            try:
                upstream.request(self.command, route.path, body=body, headers=headers)
                response = upstream.getresponse()
            except (OSError, http.client.HTTPException) as error:
                log.error("engine unreachable for %s %s: %s", self.command, route.path, error)
                self._refuse(502, f"cannot reach the Docker engine ({error})")
                return
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

    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = do_PATCH = do_OPTIONS = _handle


class DockerProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], socket_path: str, policy: ProxyPolicy) -> None:
        super().__init__(address, _Handler)
        self.socket_path = socket_path
        self.policy = policy

    def connect(self, timeout: float | None = None) -> UnixHTTPConnection:
        return UnixHTTPConnection(self.socket_path, timeout=timeout)

    def _inspect(self, path: str, what: str) -> dict[str, Any] | None:
        """GET a JSON object from the engine; None when it answers 404."""
        connection = self.connect(timeout=30)
        try:
            connection.request("GET", path, headers={"Host": "docker"})
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise EngineUnavailable(f"cannot inspect {what} on the Docker engine ({error})") from None
        finally:
            connection.close()
        if response.status == 404:
            return None
        if response.status != 200:
            raise Refused(f"cannot inspect {what} (the engine answered {response.status})")
        info = json.loads(raw)
        if not isinstance(info, dict):
            raise EngineUnavailable(f"the engine's answer about {what} is not an object")
        return info

    def check_container(self, plan: ContainerPlan) -> bytes:
        """The body to forward once the volumes and, where none is given, the image's user are judged."""
        for name in plan.volumes:
            info = self._inspect(f"/volumes/{quote(name, safe='')}", f"volume {name!r}")
            if info is None:
                raise Refused(f"volume {name!r} does not exist: create it first (POST /volumes/create with "
                              f"the label {JOB_LABEL})")  # fmt: skip
            volume_job = (info.get("Labels") or {}).get(JOB_LABEL)
            if not volume_job:
                raise Refused(f"volume {name!r} is not one of trainguard's (no {JOB_LABEL} label)")
            if volume_job != plan.job:
                # One job's container never sees another job's tensors (tenants apart).
                raise Refused(f"volume {name!r} belongs to job {volume_job!r}, not to this container's "
                              f"job {plan.job!r}")  # fmt: skip
            if info.get("Driver") != "local" or info.get("Options"):
                raise Refused(f"volume {name!r} has driver {info.get('Driver')!r} with options "
                              f"{info.get('Options')!r}: only local volumes without options are mounted")  # fmt: skip
        user = plan.user
        if user is None:
            info = self._inspect(f"/images/{quote(plan.image, safe='')}/json", f"image {plan.image!r}")
            if info is None:
                raise Missing(f"No such image: {plan.image}")
            image_user = str((info.get("Config") or {}).get("User") or "")
            user = parse_user(image_user, f"image {plan.image!r}'s USER").spec()
        return plan.forwarded_body(user)

    def require_label(self, collection: str, object_id: str) -> str:
        """The full id (container) or name (volume) of a labelled object; refuses any other."""
        suffix = "/json" if collection == "containers" else ""
        info = self._inspect(f"/{collection}/{quote(object_id, safe='')}{suffix}", f"{collection[:-1]} {object_id!r}")
        if info is None:
            raise Missing(f"no such {collection[:-1]}: {object_id}")
        labels = (info.get("Config") or {}).get("Labels") if collection == "containers" else info.get("Labels")
        if not (labels or {}).get(JOB_LABEL):
            raise Refused(f"{collection[:-1]} {object_id!r} is not one of trainguard's (no {JOB_LABEL} label)")
        pinned = info.get("Id") if collection == "containers" else info.get("Name")
        if not isinstance(pinned, str) or not pinned:
            raise EngineUnavailable(f"the engine's answer about {object_id!r} names no id")
        return pinned
