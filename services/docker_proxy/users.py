"""Container users as the runtime reads them, so that no spelling of uid 0 gets through.

The engine hands ``User`` to the runtime, which splits it at the first ``:`` into user and group
and takes each as a number when Go's ``strconv.Atoi`` parses it (``00``, ``+0`` and ``-0`` are all
0), otherwise as a name looked up in the image's ``/etc/passwd`` / ``/etc/group``. An empty user
part keeps the default, uid 0. The proxy cannot read an image's passwd file, where any name may map
to uid 0, so it accepts numbers only and forwards them spelled canonically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.services.docker_proxy.refusals import Refused

__all__ = ["ContainerUser", "parse_user"]

_GO_ATOI = re.compile(r"[+-]?[0-9]+")  # what strconv.Atoi accepts (no spaces, no underscores)
_MAX_ID = 2**31 - 1  # the runtime's upper bound for a uid/gid


@dataclass(frozen=True)
class ContainerUser:
    uid: int
    gid: int | None = None  # None: the passwd entry's group, else 0 as the runtime defaults it

    def spec(self) -> str:
        """The canonical ``uid[:gid]`` forwarded to the engine."""
        return str(self.uid) if self.gid is None else f"{self.uid}:{self.gid}"


def _number(part: str, what: str, spec: str, source: str) -> int:
    if part == "root":
        raise Refused(f"{source} {spec!r}: the container would run as root: give a non-root user "
                      "(TRAINGUARD_JOB_USER, or USER in the image)")  # fmt: skip
    if not _GO_ATOI.fullmatch(part):
        raise Refused(
            f"user {spec!r}: the {what} {part!r} is a name, which the runtime looks up in the image's "
            f"own /etc/{'passwd' if what == 'user' else 'group'} (any name can be uid 0 there); give a "
            "number, e.g. 10001:10001 (TRAINGUARD_JOB_USER, or a numeric USER in the image)"
        )
    value = int(part)
    if value == 0:
        raise Refused(f"{source} {spec!r}: the container would run as root ({what} id 0): give a non-root "
                      "user (TRAINGUARD_JOB_USER, or USER in the image)")  # fmt: skip
    if not 0 < value <= _MAX_ID:
        raise Refused(f"{source} {spec!r}: {what} id {value} is outside 1..{_MAX_ID}")
    return value


def parse_user(spec: str, source: str = "User") -> ContainerUser:
    """Judge a ``user[:group]`` spec; raises :class:`Refused` unless both are non-zero numbers."""
    user, _, group = spec.partition(":")
    if not user:
        raise Refused(f"{source} {spec!r}: without a user the container runs as root; give a non-root user "
                      "(TRAINGUARD_JOB_USER, or USER in the image)")  # fmt: skip
    uid = _number(user, "user", spec, source)
    gid = _number(group, "group", spec, source) if group else None  # "10001:" keeps the default group
    return ContainerUser(uid, gid)
