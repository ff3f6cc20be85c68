"""A container-create body rebuilt from an allow-list: only fields the launcher needs, each judged.

What the proxy forwards is this rebuilt body, serialised canonically; a field it does not know, in
any spelling, is refused rather than passed on. Every container must:
* carry the label ``trainguard.job``;
* drop every capability (``CapDrop: [ALL]``, no ``CapAdd``) and set ``no-new-privileges``;
* run as a non-zero numeric uid (:mod:`.users`), its ``User`` or else its image's;
* mount only tmpfs, anonymous volumes, ``local`` volumes without driver options labelled with the
  container's own ``trainguard.job`` (the server inspects each), or host paths under the configured bind
  roots (none by default).
Nothing else is accepted: no privileged mode, devices, host namespaces, sysctls, runtimes, volume
drivers or driver options, port bindings, log drivers, extra groups.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainguard.services.docker_proxy.gojson import JsonObject, decode_object, fields_of, go_fold, map_of
from trainguard.services.docker_proxy.refusals import BadRequest, Refused
from trainguard.services.docker_proxy.users import parse_user
from trainguard.services.docker_proxy.values import (
    as_bool,
    as_int,
    as_str,
    as_str_list,
    as_str_map,
    as_strslice,
)

__all__ = ["JOB_LABEL", "ContainerPlan", "ContainerSpecJudge", "VOLUME_NAME", "canonical_json"]

JOB_LABEL = "trainguard.job"
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")  # the local volume driver's names
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:@-]{0,254}")
_SIGNAL = re.compile(r"[A-Za-z0-9+-]{1,16}")
_NO_NEW_PRIVILEGES = ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true")
_RESTART_POLICIES = ("", "no", "always", "unless-stopped", "on-failure")
_RESOURCES = ("Memory", "MemorySwap", "MemoryReservation", "NanoCpus", "CpuShares", "CpuPeriod", "CpuQuota",
              "PidsLimit", "ShmSize")  # fmt: skip


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode()


def _container_path(value: Any, where: str) -> str:
    path = as_str(value, where)
    if not path.startswith("/") or posixpath.normpath(path) == "/" or ":" in path:
        raise BadRequest(f"{where} {path!r} must be an absolute path in the container, not /")
    return path


@dataclass(frozen=True)
class ContainerPlan:
    """A judged container-create request: what is forwarded once the server's checks pass."""

    body: Mapping[str, Any]  # the rebuilt Config + HostConfig + NetworkingConfig
    image: str
    user: str | None  # canonical uid[:gid] (as given where root is allowed); None: judge the image's USER
    volumes: tuple[str, ...]  # named volumes mounted: each must be trainguard's, local, without options

    @property
    def job(self) -> str:
        """The job the container is labelled with (required by the judge)."""
        return str((self.body.get("Labels") or {}).get(JOB_LABEL, ""))

    def forwarded_body(self, user: str) -> bytes:
        """The body with the judged user written in, so the engine cannot fall back to another one."""
        return canonical_json({**self.body, "User": user} if user else dict(self.body))


class ContainerSpecJudge:
    """Rebuilds a container-create body; raises :class:`Refused` (or :class:`BadRequest`)."""

    def __init__(
        self, bind_roots: tuple[str, ...], allowed_networks: tuple[str, ...], refuse_root: bool = True
    ) -> None:
        self.bind_roots = tuple(posixpath.normpath(root) for root in bind_roots)
        self.allowed_networks = allowed_networks
        self.refuse_root = refuse_root

    def judge(self, body: bytes) -> ContainerPlan:
        volumes: list[str] = []
        config: dict[str, Any] = {}
        readers: dict[str, Callable[[Any, str], Any]] = {
            "Hostname": as_str, "Domainname": as_str, "User": as_str, "Env": as_str_list,
            "Cmd": as_strslice, "Entrypoint": as_strslice, "WorkingDir": as_str,
            "Image": lambda v, w: as_str(v, w, _IMAGE, "an image reference"),
            "Labels": as_str_map, "Volumes": self._anonymous_volumes,
            "StopSignal": lambda v, w: as_str(v, w, _SIGNAL, "a signal"),
            "StopTimeout": lambda v, w: as_int(v, w, 0, 86400),
            **dict.fromkeys(("AttachStdin", "AttachStdout", "AttachStderr", "Tty", "OpenStdin", "StdinOnce",
                             "NetworkDisabled"), as_bool),
            "HostConfig": lambda v, w: self._host_config(v, w, volumes),
            "NetworkingConfig": self._networking_config,
        }  # fmt: skip
        for name, value in fields_of(decode_object(body), readers, "container").items():
            config[name] = readers[name](value, name)
        image = config.get("Image") or ""
        if not image:
            raise BadRequest("Image is required")
        if not (config.get("Labels") or {}).get(JOB_LABEL):
            raise Refused(f"a container must carry the label {JOB_LABEL}")
        if "HostConfig" not in config:
            self._host_config(None, "HostConfig", volumes)  # refuses: CapDrop and SecurityOpt are required
        user: str | None = config.pop("User", "")
        if self.refuse_root:
            user = parse_user(user).spec() if user else None  # None: the server judges the image's USER
        return ContainerPlan(config, image, user, tuple(volumes))

    # -- Config ------------------------------------------------------------------------------------
    @staticmethod
    def _anonymous_volumes(value: Any, where: str) -> dict[str, dict[str, Any]]:
        targets: dict[str, dict[str, Any]] = {}
        for target, member in map_of(value, where).items():
            if member is not None and not (isinstance(member, JsonObject) and not member.pairs):
                raise BadRequest(f"{where}[{target!r}] must be {{}}")
            targets[_container_path(target, f"{where} key")] = {}
        return targets

    def _networking_config(self, value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, JsonObject):
            # docker-py sends {"<network>": null} here; Go ignores such keys, so they are dropped
            value = JsonObject(tuple(
                (key, member) for key, member in value.pairs if member is not None or go_fold(key) == "ENDPOINTSCONFIG"
            ))  # fmt: skip
        endpoints = map_of(fields_of(value, ("EndpointsConfig",), where).get("EndpointsConfig"),
                           f"{where}.EndpointsConfig")  # fmt: skip
        rebuilt = {}
        for network, settings in endpoints.items():
            self._check_network(network, f"{where}.EndpointsConfig")
            fields = fields_of(settings, ("Aliases",), f"{where}.EndpointsConfig[{network!r}]")
            rebuilt[network] = {"Aliases": as_str_list(fields["Aliases"], "Aliases")} if "Aliases" in fields else {}
        return {"EndpointsConfig": rebuilt} if rebuilt else {}

    def _check_network(self, network: str, where: str) -> None:
        if network == "host" or network.startswith("container:"):
            raise Refused(f"{where}={network!r} is refused: job containers get namespaces of their own")
        if self.allowed_networks and network not in ("", "default", *self.allowed_networks):
            raise Refused(f"network {network!r} is not one of {', '.join(self.allowed_networks)}")

    # -- HostConfig --------------------------------------------------------------------------------
    def _host_config(self, value: Any, where: str, volumes: list[str]) -> dict[str, Any]:
        readers: dict[str, Callable[[Any, str], Any]] = {
            "Binds": lambda v, w: [self._bind(bind, f"{w}[{i}]", volumes) for i, bind in enumerate(as_str_list(v, w))],
            "Mounts": lambda v, w: self._mounts(v, w, volumes),
            "NetworkMode": self._network_mode, "RestartPolicy": self._restart_policy,
            "CapDrop": self._cap_drop, "CapAdd": self._cap_add, "SecurityOpt": self._security_opt,
            "Privileged": self._privileged,
            **dict.fromkeys(("AutoRemove", "Init", "ReadonlyRootfs"), as_bool),
            **dict.fromkeys(_RESOURCES, as_int),
        }  # fmt: skip
        fields = fields_of(value, readers, where)
        host = {name: readers[name](member, f"{where}.{name}") for name, member in fields.items()}
        if "CapDrop" not in host:
            raise Refused("CapDrop must include ALL: job containers get no capabilities")
        if "SecurityOpt" not in host:
            raise Refused("SecurityOpt must include no-new-privileges")
        host.pop("Privileged", None)
        if not host.get("CapAdd"):
            host.pop("CapAdd", None)
        return host

    @staticmethod
    def _privileged(value: Any, where: str) -> bool:
        if as_bool(value, where):
            raise Refused("privileged containers are refused")
        return False

    @staticmethod
    def _cap_drop(value: Any, where: str) -> list[str]:
        if "ALL" not in [cap.upper() for cap in as_strslice(value, where)]:
            raise Refused(f"CapDrop must include ALL: job containers get no capabilities (got {value!r})")
        return ["ALL"]  # ALL drops everything: the other entries add nothing

    @staticmethod
    def _cap_add(value: Any, where: str) -> list[str]:
        if as_strslice(value, where):
            raise Refused(f"CapAdd {value!r} is refused: job containers get no capabilities")
        return []

    @staticmethod
    def _security_opt(value: Any, where: str) -> list[str]:
        options = as_str_list(value, where)
        for option in options:
            if option not in _NO_NEW_PRIVILEGES:
                raise Refused(f"SecurityOpt {option!r} is refused: only no-new-privileges is allowed")
        if not options:
            raise Refused("SecurityOpt must include no-new-privileges")
        return ["no-new-privileges"]

    def _network_mode(self, value: Any, where: str) -> str:
        network = as_str(value, where)
        self._check_network(network, "NetworkMode")
        return network

    @staticmethod
    def _restart_policy(value: Any, where: str) -> dict[str, Any]:
        fields = fields_of(value, ("Name", "MaximumRetryCount"), where)
        name = as_str(fields.get("Name", ""), f"{where}.Name")
        if name not in _RESTART_POLICIES:
            raise BadRequest(f"{where}.Name {name!r} is not one of {', '.join(_RESTART_POLICIES[1:])}")
        retries = as_int(fields.get("MaximumRetryCount", 0), f"{where}.MaximumRetryCount", 0, 1000)
        return {"Name": name, "MaximumRetryCount": retries}

    def _bind(self, raw: str, where: str, volumes: list[str]) -> str:
        # The engine's Linux parser: target | source:target | source:target:mode; a source that is
        # an absolute path is the host's, anything else names a volume.
        parts = raw.split(":")
        if len(parts) > 3:
            raise BadRequest(f"{where} {raw!r} is not source:target[:mode]")
        source, target, mode = ("", parts[0], "") if len(parts) == 1 else (parts + [""])[:3]
        _container_path(target, where)
        if mode not in ("", "rw", "ro"):
            raise Refused(f"{where} {raw!r}: mode {mode!r} is refused (rw or ro only)")
        if len(parts) > 1:
            self._source(source, where, volumes, host_path=source.startswith("/"))
        return raw

    def _mounts(self, value: Any, where: str, volumes: list[str]) -> list[dict[str, Any]]:
        if isinstance(value, JsonObject) or not isinstance(value, list):
            raise BadRequest(f"{where} must be a list")
        mounts = []
        for index, item in enumerate(value):
            at = f"{where}[{index}]"
            fields = fields_of(item, ("Type", "Source", "Target", "ReadOnly", "TmpfsOptions", "VolumeOptions",
                                      "BindOptions"), at)  # fmt: skip
            for refused in ("VolumeOptions", "BindOptions"):
                if refused in fields:
                    raise Refused(f"{at}.{refused} is refused (volume drivers, driver options and propagation "
                                  "are not for job containers)")  # fmt: skip
            kind = as_str(fields.get("Type", ""), f"{at}.Type")
            mount: dict[str, Any] = {"Type": kind, "Target": _container_path(fields.get("Target"), f"{at}.Target")}
            source = as_str(fields.get("Source", ""), f"{at}.Source")
            if kind in ("bind", "volume"):
                if source or kind == "bind":
                    self._source(source, at, volumes, host_path=kind == "bind")
                mount["Source"] = source
            elif kind == "tmpfs":
                if source:
                    raise BadRequest(f"{at}.Source must be empty for a tmpfs")
            else:
                raise Refused(f"{at}: mount type {kind!r} is refused")
            if "TmpfsOptions" in fields:
                if kind != "tmpfs":
                    raise BadRequest(f"{at}.TmpfsOptions is for tmpfs mounts")
                options = fields_of(fields["TmpfsOptions"], ("SizeBytes", "Mode"), f"{at}.TmpfsOptions")
                mount["TmpfsOptions"] = {name: as_int(member, f"{at}.TmpfsOptions.{name}", 0)
                                         for name, member in options.items()}  # fmt: skip
            if "ReadOnly" in fields:
                mount["ReadOnly"] = as_bool(fields["ReadOnly"], f"{at}.ReadOnly")
            mounts.append(mount)
        return mounts

    def _source(self, source: str, where: str, volumes: list[str], host_path: bool) -> None:
        if host_path:
            self._check_host_path(source)
        elif VOLUME_NAME.fullmatch(source):
            volumes.append(source)
        else:
            raise BadRequest(f"{where}: {source!r} is neither an absolute host path nor a volume name")

    def _check_host_path(self, source: str) -> None:
        normalized = posixpath.normpath(source) if source.startswith("/") else ""
        if normalized and normalized != source:
            # the kernel resolves ".." after symlinks, not as normpath does: judge only plain paths
            raise Refused(f"bind mount of host path {source!r} is refused: write it without '.', '..' or '//'")
        for root in self.bind_roots:
            if root != "/" and (normalized == root or normalized.startswith(root + "/")):
                return
        raise Refused(
            f"bind mount of host path {source!r} is refused"
            + (f" (allowed under: {', '.join(self.bind_roots)})" if self.bind_roots else " (only named volumes)")
        )
