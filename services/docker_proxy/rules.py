"""What the Docker API proxy lets through: pure decisions on (method, path, query, body), no I/O.

Every container the proxy lets the API create must:
* carry the label ``trainguard.job`` (so the proxy can recognise it afterwards);
* drop every capability (``CapDrop: [ALL]``, no ``CapAdd``) and set ``no-new-privileges``;
* not be privileged, nor share the host's network, PID, IPC, UTS, user or cgroup namespaces, nor
  another container's; no devices, no custom runtime, no sysctls, no ``VolumesFrom``;
* mount only named volumes and tmpfs, or host paths under the configured bind roots (none by
  default): ``/`` or ``/var/run/docker.sock`` mounted into a job is refused.
Operations on existing containers and volumes are allowed only on labelled ones (the server checks
the label by inspecting the object first); listings are narrowed to labelled objects.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = ["JOB_LABEL", "Missing", "ProxyPolicy", "Refused", "Route", "is_root_user", "parse_body"]

JOB_LABEL = "trainguard.job"
_VERSION_PREFIX = re.compile(r"^/v\d+(\.\d+)?(?=/)")
_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}"
_HOST_NAMESPACES = ("NetworkMode", "PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode")


class _Fields(dict):
    """A JSON object whose field lookups ignore case, as Go's encoding/json (dockerd) does."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        lowered = key.lower()
        for name, value in self.items():
            if name.lower() == lowered:
                return value
        return default


def _object(pairs: list[tuple[str, Any]]) -> _Fields:
    seen: set[str] = set()
    for name, _ in pairs:
        if name.lower() in seen:
            # dockerd would take one of them; which one must not be for the client to choose
            raise Refused(f"field {name!r} appears twice (names are compared ignoring case)")
        seen.add(name.lower())
    return _Fields(pairs)


class Refused(Exception):
    """The proxy refuses a request; the message says why (docker clients show it as the error)."""

    status = 403


class Missing(Refused):
    """The object does not exist: answered 404 as the engine would, so clients see NotFound."""

    status = 404


@dataclass(frozen=True)
class Route:
    """What the server must do with an allowed request."""

    path: str  # forwarded path (version prefix kept) and query string
    labelled_container: str | None = None  # the server must first check this container's label
    labelled_volume: str | None = None  # ... or this volume's
    creates_container: bool = False  # the server must check the user it would run as


# (method, pattern) -> which object the request acts on ("container", "volume" or None)
_ROUTES: list[tuple[str, re.Pattern[str], str | None]] = [
    (m, re.compile(p), kind)
    for m, p, kind in [
        ("GET", r"^/_ping$", None),
        ("HEAD", r"^/_ping$", None),
        ("GET", r"^/version$", None),
        ("GET", r"^/containers/json$", None),
        ("POST", r"^/containers/create$", None),
        ("GET", rf"^/containers/(?P<id>{_ID})/json$", "container"),
        ("GET", rf"^/containers/(?P<id>{_ID})/logs$", "container"),
        ("POST", rf"^/containers/(?P<id>{_ID})/(start|stop|kill|restart|wait)$", "container"),
        ("DELETE", rf"^/containers/(?P<id>{_ID})$", "container"),
        ("GET", r"^/volumes$", None),
        ("POST", r"^/volumes/create$", None),
        ("GET", rf"^/volumes/(?P<id>{_ID})$", "volume"),
        ("DELETE", rf"^/volumes/(?P<id>{_ID})$", "volume"),
        ("GET", rf"^/networks/(?P<id>{_ID})$", None),
        ("GET", r"^/images/(?P<id>[A-Za-z0-9][A-Za-z0-9_./:@-]{0,254})/json$", None),
    ]
]


def _labels_filter(query: str) -> str:
    """The query with ``filters.label`` narrowed to objects that carry the job label."""
    pairs = parse_qsl(query, keep_blank_values=True)
    filters: dict[str, Any] = {}
    rest = []
    for key, value in pairs:
        if key == "filters":
            try:
                filters = json.loads(value) if value else {}
            except ValueError:
                raise Refused("filters is not JSON") from None
            if not isinstance(filters, dict):
                raise Refused("filters must be a JSON object")
        else:
            rest.append((key, value))
    labels = filters.get("label") or []
    if isinstance(labels, dict):  # the older map form {"label": {"a=b": true}}
        labels = [name for name, on in labels.items() if on]
    if not isinstance(labels, list):
        raise Refused("filters.label must be a list")
    if not any(str(label).split("=", 1)[0] == JOB_LABEL for label in labels):
        labels = [*labels, JOB_LABEL]
    filters["label"] = labels
    return urlencode([*rest, ("filters", json.dumps(filters))])


def is_root_user(user: str) -> bool:
    """True for the user specs that run as uid 0: empty (the default), ``root``, ``0``, ``0:gid``..."""
    name = user.strip().split(":", 1)[0]
    return name in ("", "root", "0")


@dataclass(frozen=True)
class ProxyPolicy:
    bind_roots: tuple[str, ...] = ()  # host directories a job may bind-mount (none by default)
    allowed_networks: tuple[str, ...] = field(default_factory=tuple)  # empty: any bridge network
    # Refuse containers that would run as uid 0 (their User, else their image's). The server checks
    # the image, which needs I/O: see DockerProxy.check_user.
    refuse_root: bool = True

    def route(self, method: str, raw_path: str, query: str, body: bytes) -> Route:
        """Decide on one request; raises :class:`Refused`."""
        match = _VERSION_PREFIX.match(raw_path)
        prefix = match.group(0) if match else ""
        path = raw_path[len(prefix):]
        for route_method, pattern, kind in _ROUTES:
            found = pattern.match(path)
            if route_method != method or not found:
                continue
            if path in ("/containers/json", "/volumes"):
                query = _labels_filter(query)
            if path == "/containers/create":
                try:
                    self.check_container(parse_body(body))
                except (AttributeError, TypeError) as error:  # a member of the wrong JSON type
                    raise Refused(f"malformed container spec: {error}") from None
            if path == "/volumes/create":
                labels = parse_body(body).get("Labels") or {}
                if not isinstance(labels, dict) or not dict.get(labels, JOB_LABEL):
                    raise Refused(f"a volume must carry the label {JOB_LABEL}")
            forwarded = raw_path + (f"?{query}" if query else "")
            object_id = found.groupdict().get("id")
            if path.startswith("/networks/") and self.allowed_networks and object_id not in self.allowed_networks:
                # an inspect lists every container on the network: only the jobs' network is shown
                raise Refused(f"network {object_id!r} is not one of {', '.join(self.allowed_networks)}")
            return Route(
                path=forwarded,
                labelled_container=object_id if kind == "container" else None,
                labelled_volume=object_id if kind == "volume" else None,
                creates_container=path == "/containers/create",
            )
        raise Refused(f"{method} {path} is not an operation the trainguard launcher needs")

    # -- container create --------------------------------------------------------------------------
    def check_container(self, spec: Mapping[str, Any]) -> None:
        labels = spec.get("Labels") or {}
        if not isinstance(labels, dict) or not dict.get(labels, JOB_LABEL):
            raise Refused(f"a container must carry the label {JOB_LABEL}")
        host = spec.get("HostConfig") or {}
        if not isinstance(host, dict):
            raise Refused("HostConfig must be an object")
        for key in ("Binds", "Mounts", "CapAdd", "CapDrop", "SecurityOpt", "Devices", "DeviceRequests", "VolumesFrom"):
            if host.get(key) is not None and not isinstance(host.get(key), list):
                raise Refused(f"HostConfig.{key} must be a list")
        if host.get("Privileged"):
            raise Refused("privileged containers are refused")
        if host.get("CapAdd"):
            raise Refused(f"CapAdd {host['CapAdd']!r} is refused: job containers get no capabilities")
        if "ALL" not in [str(c).upper() for c in host.get("CapDrop") or []]:
            raise Refused("CapDrop must include ALL")
        security = [str(option).replace(":", "=") for option in host.get("SecurityOpt") or []]
        if not any(option in ("no-new-privileges", "no-new-privileges=true") for option in security):
            raise Refused("SecurityOpt must include no-new-privileges")
        for option in security:
            if "unconfined" in option or option == "label=disable" or option == "no-new-privileges=false":
                raise Refused(f"SecurityOpt {option!r} is refused")
        for key in _HOST_NAMESPACES:
            value = str(host.get(key) or "")
            if value == "host" or value.startswith("container:"):
                raise Refused(f"{key}={value!r} is refused: job containers get namespaces of their own")
        network = str(host.get("NetworkMode") or "")
        if self.allowed_networks and network not in ("", "default", *self.allowed_networks):
            raise Refused(f"network {network!r} is not one of {', '.join(self.allowed_networks)}")
        for key in ("Devices", "DeviceRequests", "DeviceCgroupRules", "VolumesFrom", "Sysctls", "Links"):
            if host.get(key):
                raise Refused(f"{key} is refused")
        if host.get("Runtime") not in (None, "", "runc"):
            raise Refused(f"runtime {host['Runtime']!r} is refused")
        if host.get("Cgroup") or host.get("CgroupParent"):
            raise Refused("Cgroup/CgroupParent is refused")
        for bind in host.get("Binds") or []:
            source = str(bind).split(":", 1)[0]
            if source.startswith("/"):
                self._check_host_path(source)
        for mount in host.get("Mounts") or []:
            kind = (mount or {}).get("Type", "volume")
            if kind == "bind":
                self._check_host_path(str(mount.get("Source") or ""))
            elif kind not in ("volume", "tmpfs"):
                raise Refused(f"mount type {kind!r} is refused")
        networking = (spec.get("NetworkingConfig") or {}).get("EndpointsConfig") or {}
        if self.allowed_networks and any(name not in self.allowed_networks for name in networking):
            raise Refused(f"networks {sorted(networking)} are not all in {', '.join(self.allowed_networks)}")

    def _check_host_path(self, source: str) -> None:
        normalized = posixpath.normpath(source)
        for root in self.bind_roots:
            root = posixpath.normpath(root)
            if root != "/" and (normalized == root or normalized.startswith(root + "/")):
                return
        raise Refused(
            f"bind mount of host path {source!r} is refused"
            + (f" (allowed under: {', '.join(self.bind_roots)})" if self.bind_roots else " (only named volumes)")
        )


def parse_body(body: bytes) -> dict[str, Any]:
    """A request body as dockerd reads it (field names ignoring case; duplicates refused)."""
    try:
        value = json.loads(body or b"{}", object_pairs_hook=_object)
    except ValueError:
        raise Refused("the request body is not JSON") from None
    if not isinstance(value, dict):
        raise Refused("the request body must be a JSON object")
    return value
