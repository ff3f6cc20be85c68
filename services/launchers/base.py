"""The launcher interface the control API drives. Back-ends implement :class:`Launcher`."""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainguard.services.errors import ServiceError

__all__ = [
    "ComponentSpec",
    "ComponentState",
    "ComponentStatus",
    "JobLaunch",
    "Launcher",
    "LaunchRefused",
    "LauncherError",
    "LauncherSupport",
    "bounded_int",
    "launcher_support",
    "read_component_file",
    "read_host_file",
]


class LauncherError(ServiceError, RuntimeError):
    """The back-end could not do what was asked (engine unreachable, image missing...)."""


class LaunchRefused(LauncherError):
    """The back-end refused what the job asked for (its image, a path, a value): the request's fault,
    reported to the caller as a ClientError, not as the service's."""


@dataclass(frozen=True)
class LauncherSupport:
    """What a back-end can run, asked when a job is created so that one it cannot run is refused then.

    Attributes:
        max_instance_count: the most training instances (hosts) one job may have.
        container_paths: a component's ``working_dir`` is a path inside its container (any absolute
            path, as SageMaker's ``/opt/ml/code``), not a directory on the API's host.
    """

    max_instance_count: int = 1
    container_paths: bool = False


def launcher_support(launcher: object) -> LauncherSupport:
    """``launcher.support``; a back-end that does not say runs one instance in host directories."""
    support = getattr(launcher, "support", None)
    return support if isinstance(support, LauncherSupport) else LauncherSupport()


def bounded_int(value: int | None, variable: str, default: int, low: int, high: int, what: str) -> int:
    """``value``, else the environment variable ``variable``, else ``default``; LauncherError
    naming the source unless it is an integer in ``low..high``. Read when a launcher is built."""
    if value is None:
        raw = os.environ.get(variable, "").strip() or str(default)
        try:
            value = int(raw)
        except ValueError:
            raise LauncherError(f"{variable}={raw!r}: use an integer {low}..{high}") from None
    if not low <= value <= high:
        raise LauncherError(f"{what} {value}: use an integer {low}..{high}")
    return value


@dataclass(frozen=True)
class ComponentSpec:
    """One process/container of a job.

    Attributes:
        role: ``"training"``, ``"uploader"`` or ``"rule:<RuleConfigurationName>"``.
        image: container image (ignored by the local-process launcher).
        command: argv.
        environment: extra environment variables.
        cpus: CPU limit (cores, may be fractional); None = unlimited.
        memory_mb: memory limit; None = unlimited.
        volumes: host path -> container path (Docker); the local launcher ignores it.
        working_dir: working directory inside the container / for the process.
        gpus: GPUs per instance (the Ray launcher requests them); None = none.
        instance_count: training instances (hosts); only the Ray launcher runs more than one.
        stop_grace_seconds: the longest grace a stop of this component may ask for (the uploader's
            "training ended, finish" stop); the Ray launcher, whose grace is fixed when a
            component is submitted, submits with the larger of this and its own. None: its own.
    """

    role: str
    image: str
    command: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mb: int | None = None
    volumes: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    gpus: int | None = None
    instance_count: int = 1
    stop_grace_seconds: float | None = None


@dataclass(frozen=True)
class JobLaunch:
    """Everything a launcher needs to start one job.

    Attributes:
        workspace: the job's own directory on this machine (the local plan's job directory): the
            local launcher hands it to the job's user, runs the components' relative working
            directories inside it and makes it their HOME and TMPDIR. None: the launcher makes one.
            Launchers that run containers ignore it.
    """

    job_name: str
    components: tuple[ComponentSpec, ...]
    workspace: str | None = None


class ComponentState(str, enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    EXITED = "Exited"
    MISSING = "Missing"  # the launcher has no record of it (removed, or never started)


@dataclass(frozen=True)
class ComponentStatus:
    role: str
    state: ComponentState
    exit_code: int | None = None
    reason: str = ""  # e.g. "OOMKilled", "killed by SIGKILL after 120 s grace"


class Launcher(Protocol):
    """What the control API needs from a back-end. Every method is idempotent."""

    name: str
    support: LauncherSupport  # optional: launcher_support() answers for a back-end without it

    def start(self, job: JobLaunch) -> None:
        """Start every component; raises LauncherError if the back-end cannot."""

    def status(self, job_name: str) -> dict[str, ComponentStatus]:
        """Each component's state by role (empty if the launcher knows no such job)."""

    def stop(self, job_name: str, roles: tuple[str, ...] | None = None, grace_seconds: float = 120.0) -> None:
        """SIGTERM the components (all, or ``roles``), SIGKILL those still alive after the grace."""

    def restart(self, job_name: str, role: str) -> None:
        """Start an exited component again, as it was first started (same command, environment,
        volumes, files): how a dead uploader is supervised. No-op while it runs; raises
        LauncherError when the back-end has no such component or cannot start it."""

    def logs(self, job_name: str, role: str = "training", tail: int | None = None) -> str:
        """The component's combined stdout/stderr so far."""

    def jobs(self) -> list[str]:
        """Job names this back-end has components for: how a restarted API finds its jobs again."""

    def read_file(self, job_name: str, role: str, path: str, max_bytes: int) -> bytes | None:
        """The file ``path`` as the component sees it (also once it exited), or None when it is not
        there, is not a regular file or is larger than ``max_bytes``: how the API reads the
        uploader's status file (services/uploader/status.py). Optional: see read_component_file."""

    def remove(self, job_name: str) -> None:
        """Delete the job's stopped components and their resources."""


def read_component_file(launcher: object, job_name: str, role: str, path: str, max_bytes: int) -> bytes | None:
    """``launcher.read_file(...)``; None for a back-end that cannot read its components' files."""
    read = getattr(launcher, "read_file", None)
    return read(job_name, role, path, max_bytes) if callable(read) else None


def read_host_file(path: str | Path, max_bytes: int) -> bytes | None:
    """A regular file of at most ``max_bytes`` on this machine, else None.

    The file lies in a directory the job can write: a link planted there is not followed, and a
    FIFO is neither waited on when opened nor read, so a job cannot hang or flood the reader.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # missing, a link, or unreadable: nothing said
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            data = file.read(max_bytes + 1)
        return data if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(descriptor)
