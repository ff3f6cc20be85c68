"""What the Docker API proxy lets through: pure decisions on (method, path, query, body), no I/O.

Only the operations the docker launcher uses are routed, each with the query parameters it takes;
only the two creates take a body, and what is forwarded is rebuilt from what was judged
(:mod:`.container_spec`, :mod:`.queries`), never the client's bytes. Operations on existing
containers and volumes are allowed only on labelled ones (the server inspects the object first and
then acts on it by its full id); listings are narrowed to labelled objects. API versions before
1.41 are refused: they change what the same request does (a ``HostConfig`` given to ``start``
before 1.24, host cgroup namespaces and shareable IPC by default before 1.40/1.41).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from urllib.parse import quote

from trainguard.services.docker_proxy.container_spec import (
    JOB_LABEL,
    VOLUME_NAME,
    ContainerPlan,
    ContainerSpecJudge,
    canonical_json,
)
from trainguard.services.docker_proxy.gojson import decode_object, fields_of, map_of
from trainguard.services.docker_proxy.queries import PARAMS, canonical_query
from trainguard.services.docker_proxy.refusals import BadRequest, Missing, Refused
from trainguard.services.docker_proxy.values import as_str, as_str_map

__all__ = ["JOB_LABEL", "MIN_API_VERSION", "BadRequest", "Missing", "ProxyPolicy", "Refused", "Route"]

MIN_API_VERSION = (1, 41)
_VERSION_PREFIX = re.compile(r"^/v([0-9]{1,3})\.([0-9]{1,3})(?=/)")
_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}"
_IMAGE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:@-]*(?:/[A-Za-z0-9][A-Za-z0-9_.:@-]*){0,8}"

# (method, path pattern, operation); operations name their query parameters in queries.PARAMS
_OPERATIONS: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(f"^{pattern}$"), operation)
    for method, pattern, operation in [
        ("GET", "/_ping", "ping"),
        ("HEAD", "/_ping", "ping"),
        ("GET", "/version", "version"),
        ("GET", "/containers/json", "containers.list"),
        ("POST", "/containers/create", "containers.create"),
        ("GET", f"/containers/(?P<container>{_ID})/json", "containers.inspect"),
        ("GET", f"/containers/(?P<container>{_ID})/logs", "containers.logs"),
        ("GET", f"/containers/(?P<container>{_ID})/archive", "containers.archive"),
        ("POST", f"/containers/(?P<container>{_ID})/start", "containers.start"),
        ("POST", f"/containers/(?P<container>{_ID})/stop", "containers.stop"),
        ("POST", f"/containers/(?P<container>{_ID})/restart", "containers.restart"),
        ("POST", f"/containers/(?P<container>{_ID})/kill", "containers.kill"),
        ("POST", f"/containers/(?P<container>{_ID})/wait", "containers.wait"),
        ("DELETE", f"/containers/(?P<container>{_ID})", "containers.remove"),
        ("GET", "/volumes", "volumes.list"),
        ("POST", "/volumes/create", "volumes.create"),
        ("GET", f"/volumes/(?P<volume>{_ID})", "volumes.inspect"),
        ("DELETE", f"/volumes/(?P<volume>{_ID})", "volumes.remove"),
        ("GET", f"/networks/(?P<network>{_ID})", "networks.inspect"),
        ("GET", f"/images/(?P<image>{_IMAGE_NAME})/json", "images.inspect"),
    ]
]
_LISTINGS = ("containers.list", "volumes.list")
_WITH_BODY = ("containers.create", "volumes.create")


@dataclass(frozen=True)
class Route:
    """What the server must do with an allowed request: check, then forward ``path`` and ``body``."""

    head: str  # the forwarded path up to the object (version prefix included) ...
    object_id: str | None = None  # ... the container or volume acted on ...
    tail: str = ""  # ... and what follows it, query string included
    labelled_container: str | None = None  # the server must first check this container's label
    labelled_volume: str | None = None  # ... or this volume's
    container: ContainerPlan | None = None  # a container create: user and volumes still to check
    body: bytes | None = None  # the canonical body of a volume create

    @property
    def path(self) -> str:
        return self.head + (quote(self.object_id, safe="") if self.object_id else "") + self.tail

    def on(self, object_id: str) -> Route:
        """The same operation on the object named by its full id (as the label check found it)."""
        return replace(self, object_id=object_id)


@dataclass(frozen=True)
class ProxyPolicy:
    bind_roots: tuple[str, ...] = ()  # host directories a job may bind-mount (none by default)
    allowed_networks: tuple[str, ...] = field(default_factory=tuple)  # empty: any bridge network
    # Refuse containers that would run as uid 0 (their User, else their image's). The server checks
    # the image, which needs I/O: see DockerProxy.check_container.
    refuse_root: bool = True

    def route(self, method: str, raw_path: str, query: str, body: bytes) -> Route:
        """Decide on one request; raises :class:`Refused`."""
        prefix, path = self._version(raw_path)
        for route_method, pattern, operation in _OPERATIONS:
            found = pattern.match(path)
            if route_method != method or not found:
                continue
            if body and operation not in _WITH_BODY:
                # refused, not dropped: the engine applies a HostConfig sent to start under API < 1.24
                raise Refused(f"{method} {path} takes no request body")
            forced = {"filters": ""} if operation in _LISTINGS else None
            canonical = canonical_query(query, PARAMS[operation], forced)
            ids = found.groupdict()
            if ids.get("network") and self.allowed_networks and ids["network"] not in self.allowed_networks:
                # an inspect lists every container on the network: only the jobs' network is shown
                raise Refused(f"network {ids['network']!r} is not one of {', '.join(self.allowed_networks)}")
            tail = f"?{canonical}" if canonical else ""
            container, volume = ids.get("container"), ids.get("volume")
            if container or volume:
                collection = "containers" if container else "volumes"
                rest = path[len(f"/{collection}/") + len(container or volume or "") :]
                return Route(f"{prefix}/{collection}/", container or volume, rest + tail,
                             labelled_container=container, labelled_volume=volume)  # fmt: skip
            if operation == "containers.create":
                judge = ContainerSpecJudge(self.bind_roots, self.allowed_networks, self.refuse_root)
                return Route(prefix + path + tail, container=judge.judge(body))
            if operation == "volumes.create":
                return Route(prefix + path + tail, body=self._volume(body))
            return Route(prefix + path + tail)
        raise Refused(f"{method} {path} is not an operation the trainguard launcher needs")

    @staticmethod
    def _version(raw_path: str) -> tuple[str, str]:
        match = _VERSION_PREFIX.match(raw_path)
        if not match:
            return "", raw_path
        version = (int(match.group(1)), int(match.group(2)))
        if version < MIN_API_VERSION or version[0] != 1:
            raise Refused(f"API version {match.group(0)[2:]} is refused: the proxy speaks "
                          f"{'.'.join(map(str, MIN_API_VERSION))} and later 1.x")  # fmt: skip
        return f"/v{version[0]}.{version[1]}", raw_path[match.end() :]

    @staticmethod
    def _volume(body: bytes) -> bytes:
        """A volume create rebuilt: the ``local`` driver, no driver options, the job label."""
        fields = fields_of(decode_object(body or b"{}"), ("Name", "Driver", "DriverOpts", "Labels"), "volume")
        driver = as_str(fields.get("Driver", ""), "Driver")
        if driver not in ("", "local"):
            raise Refused(f"volume driver {driver!r} is refused: only the local driver")
        if options := map_of(fields.get("DriverOpts"), "DriverOpts"):
            raise Refused(f"DriverOpts {options!r} are refused: a job volume takes no driver options "
                          "(the local driver's type/o/device mount host paths)")  # fmt: skip
        labels = as_str_map(fields.get("Labels"), "Labels")
        if not labels.get(JOB_LABEL):
            raise Refused(f"a volume must carry the label {JOB_LABEL}")
        rebuilt: dict[str, object] = {"Driver": "local", "Labels": labels}
        name = as_str(fields.get("Name", ""), "Name")
        if name:
            if not VOLUME_NAME.fullmatch(name) or len(name) > 255:
                raise BadRequest(f"volume Name {name!r} is not a volume name")
            rebuilt["Name"] = name
        return canonical_json(rebuilt)
