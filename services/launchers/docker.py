"""Docker back-end: one container per job component, through the Docker SDK (``docker`` 7.x).

Every container and volume carries the labels ``trainguard.job=<job>`` and ``trainguard.role=<role>``,
so everything a job owns is found again from the engine alone: a restarted control API calls
:meth:`DockerLauncher.jobs` and :meth:`DockerLauncher.status` and picks up where it left off.

Configuration (read at construction, never at import):
    TRAINGUARD_DOCKER_NETWORK   network the job containers join (the compose stack's network, so
                                they reach S3 and the API by service name); unset = engine default.
    DOCKER_HOST                 the engine (default: /var/run/docker.sock), as for the docker CLI.
    TRAINGUARD_JOB_USER         user[:group] every job container runs as (default: the image's USER;
                                trainguard's images use 10001, and the docker proxy refuses root).
"""

from __future__ import annotations

import importlib
import io
import math
import os
import re
import signal
import tarfile
import threading
from collections.abc import Iterable
from typing import Any

from trainguard.services.launchers.base import (
    ComponentSpec,
    ComponentState,
    ComponentStatus,
    JobLaunch,
    LauncherError,
    LauncherSupport,
    LaunchRefused,
    bounded_int,
)

__all__ = ["DockerLauncher", "JOB_LABEL", "ROLE_LABEL", "container_name", "docker_available"]

JOB_LABEL = "trainguard.job"
ROLE_LABEL = "trainguard.role"
_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
# Container states as the engine reports them (State.Status).
_RUNNING_STATES = {"running", "restarting", "paused", "removing"}
_EXITED_STATES = {"exited", "dead"}
_CONNECT_TIMEOUT_S = 30
_PIDS_LIMIT = 4096  # a fork bomb in a job stops here, not at the host's limit
# Job containers yield most of the CPU to the stack's services (API, S3, proxy: Docker's 1024)
# under contention, but not all of it: at the minimum weight (2) a job beside any busy container
# of default weight starves.
_DEFAULT_CPU_SHARES = 256
# A one-file archive from the engine: headers and padding to whole 512-byte blocks and records.
_TAR_OVERHEAD = 64 * 1024


def container_name(job_name: str, role: str) -> str:
    """``tg-<job>-<role>`` with anything Docker rejects in a name replaced by ``-``."""
    return _NAME_UNSAFE.sub("-", f"tg-{job_name}-{role}").strip("-")


def _docker_sdk() -> Any:
    """The Docker SDK, imported when first needed (the API runs without it on other launchers).
    It ships no type information, so it is used untyped; ImportError where it is not installed."""
    return importlib.import_module("docker")


def docker_available(timeout_s: float = 3.0) -> bool:
    """True when the Docker SDK is installed and the engine answers a ping."""
    try:
        docker = _docker_sdk()
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure to reach the engine means "not available"
        return False


def _exit_reason(state: dict[str, Any]) -> str:
    """Why a container ended, in words: OOM, a signal, or the engine's own error."""
    if state.get("OOMKilled"):
        return "OOMKilled"
    error = state.get("Error") or ""
    if error:
        return error
    code = state.get("ExitCode")
    if isinstance(code, int) and code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            return f"exit code {code}"
    return ""


class DockerLauncher:
    """:class:`trainguard.services.launchers.base.Launcher` on a Docker engine. Every method is idempotent."""

    name = "docker"
    # One container per component on one engine; working_dir is a path in the job's container
    # (SageMaker's images work in /opt/ml/code), created there by the engine.
    support = LauncherSupport(max_instance_count=1, container_paths=True)

    def __init__(
        self,
        client: Any | None = None,
        *,
        network: str | None = None,
        init: bool = True,
        user: str | None = None,
        cpu_shares: int | None = None,
    ) -> None:
        """
        Args:
            client: a ``docker.DockerClient``; default ``docker.from_env()`` (DOCKER_HOST or the socket).
            network: network for job containers; default env TRAINGUARD_DOCKER_NETWORK (unset: engine default).
            init: run an init process as PID 1 in each container (reaps zombies, forwards signals).
            user: user[:group] of every container; default env TRAINGUARD_JOB_USER (unset: the image's).
            cpu_shares: CPU weight of every job container, as ``docker run --cpu-shares`` (2-262144);
                default env TRAINGUARD_JOB_CPU_SHARES, else 256. Every container is its own cgroup,
                with the API container's weight (1024) unless told otherwise: at 1024 busy jobs
                slow the API's requests down; at 2 a job beside any busy default-weight container
                (another stack, a build) starves. Jobs share the CPU evenly among themselves and
                get all of it when nothing else wants it.
        """
        self.cpu_shares = bounded_int(
            cpu_shares, "TRAINGUARD_JOB_CPU_SHARES", _DEFAULT_CPU_SHARES, 2, 262144, "cpu_shares"
        )
        if client is None:
            try:
                docker = _docker_sdk()
            except ImportError as error:
                raise LauncherError("the Docker launcher needs the Docker SDK: pip install 'docker>=7,<8'") from error
            try:
                client = docker.from_env(timeout=_CONNECT_TIMEOUT_S)
                client.ping()
            except Exception as error:  # noqa: BLE001 - DockerException, requests errors, socket errors
                raise LauncherError(
                    f"cannot reach the Docker engine ({error}); start dockerd (bash infra/setup_docker.sh) "
                    "or set TRAINGUARD_LAUNCHER=local"
                ) from error
        self._client = client
        self._network = network if network is not None else (os.environ.get("TRAINGUARD_DOCKER_NETWORK") or None)
        self._init = init
        if user is None:
            user = os.environ.get("TRAINGUARD_JOB_USER", "")
        self._user = user or None  # None: the image's own USER
        self._lock = threading.Lock()  # start/remove of one job must not interleave

    # -- Launcher -----------------------------------------------------------------------------
    def start(self, job: JobLaunch) -> None:
        docker = _docker_sdk()

        with self._lock:
            existing = {self._role(c): c for c in self._containers(job.job_name)}
            self._check_network()
            created = []
            starting: ComponentSpec | None = None
            try:
                for starting in job.components:
                    if starting.role in existing:
                        continue  # already started (idempotent start after an API restart)
                    self._ensure_volumes(job.job_name, starting)
                    created.append(self._run(job.job_name, starting))
            except docker.errors.ImageNotFound as error:
                self._discard(created)
                # The training image is the job's (its TrainingImage); the others are the service's.
                failure = LaunchRefused if starting is not None and starting.role == "training" else LauncherError
                raise failure(
                    f"image not found for job {job.job_name!r}: {error.explanation}; "
                    "build the images with `bash infra/build_images.sh`"
                ) from error
            except docker.errors.APIError as error:
                self._discard(created)
                # 400: the engine refused a value of the job's (a limit, a path, an image reference).
                failure = LaunchRefused if error.status_code == 400 else LauncherError
                raise failure(f"docker could not start job {job.job_name!r}: {error.explanation}") from error

    def status(self, job_name: str) -> dict[str, ComponentStatus]:
        statuses: dict[str, ComponentStatus] = {}
        for container in self._containers(job_name):
            role = self._role(container)
            state = container.attrs.get("State", {})
            engine_status = state.get("Status", "")
            if engine_status in _RUNNING_STATES:
                statuses[role] = ComponentStatus(role, ComponentState.RUNNING)
            elif engine_status in _EXITED_STATES:
                code = state.get("ExitCode")
                statuses[role] = ComponentStatus(
                    role, ComponentState.EXITED, exit_code=code if isinstance(code, int) else None,
                    reason=_exit_reason(state),
                )
            else:  # "created": not started yet
                statuses[role] = ComponentStatus(role, ComponentState.PENDING)
        return statuses

    def stop(self, job_name: str, roles: tuple[str, ...] | None = None, grace_seconds: float = 120.0) -> None:
        """SIGTERM, then SIGKILL after the grace (docker's own stop); all components at once."""
        docker = _docker_sdk()

        targets = [
            c for c in self._containers(job_name)
            if (roles is None or self._role(c) in roles) and c.attrs.get("State", {}).get("Status") in _RUNNING_STATES
        ]
        # Docker takes whole seconds; round up so the process never gets less than asked.
        timeout = max(0, math.ceil(grace_seconds))
        errors: list[str] = []

        def stop_one(container: Any) -> None:
            try:
                container.stop(timeout=timeout)
            except docker.errors.NotFound:
                pass  # removed meanwhile: stopped is what was wanted
            except docker.errors.APIError as error:
                errors.append(f"{container.name}: {error.explanation}")

        threads = [threading.Thread(target=stop_one, args=(c,), daemon=True) for c in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise LauncherError(f"could not stop job {job_name!r}: " + "; ".join(errors))

    def restart(self, job_name: str, role: str) -> None:
        """Start the role's exited container again: same config, volumes and writable layer."""
        docker = _docker_sdk()

        for container in self._containers(job_name):
            if self._role(container) != role:
                continue
            if container.attrs.get("State", {}).get("Status") in _RUNNING_STATES:
                return
            try:
                container.start()
            except docker.errors.APIError as error:
                raise LauncherError(f"could not restart {container.name}: {error.explanation}") from error
            return
        raise LauncherError(f"job {job_name!r} has no {role!r} container to restart")

    def logs(self, job_name: str, role: str = "training", tail: int | None = None) -> str:
        for container in self._containers(job_name):
            if self._role(container) == role:
                raw = container.logs(stdout=True, stderr=True, tail="all" if tail is None else int(tail))
                return raw.decode("utf-8", errors="replace")
        return ""

    def read_file(self, job_name: str, role: str, path: str, max_bytes: int) -> bytes | None:
        """``path`` in the role's container (its volumes too), also once it exited: ``docker cp``."""
        docker = _docker_sdk()

        for container in self._containers(job_name):
            if self._role(container) != role:
                continue
            try:
                chunks, info = container.get_archive(path)
                if not isinstance(info, dict) or int(info.get("size", max_bytes + 1)) > max_bytes:
                    return None
                archive = bytearray()
                for chunk in chunks:
                    archive += chunk
                    if len(archive) > max_bytes + _TAR_OVERHEAD:
                        return None
            except docker.errors.NotFound:
                return None
            except docker.errors.APIError as error:
                raise LauncherError(f"could not read {path} of {container.name}: {error.explanation}") from error
            with tarfile.open(fileobj=io.BytesIO(bytes(archive))) as tar:
                member = tar.next()
                extracted = tar.extractfile(member) if member is not None and member.isfile() else None
                data = extracted.read(max_bytes + 1) if extracted is not None else None
            return data if data is not None and len(data) <= max_bytes else None
        return None

    def jobs(self) -> list[str]:
        containers = self._client.containers.list(all=True, filters={"label": JOB_LABEL})
        return sorted({c.labels.get(JOB_LABEL, "") for c in containers} - {""})

    def remove(self, job_name: str) -> None:
        """Stop what still runs (10 s grace), then delete the containers and the job's volumes."""
        docker = _docker_sdk()

        with self._lock:
            self.stop(job_name, grace_seconds=10)
            for container in self._containers(job_name):
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
            for volume in self._client.volumes.list(filters={"label": f"{JOB_LABEL}={job_name}"}):
                try:
                    volume.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as error:
                    raise LauncherError(f"could not remove volume {volume.name}: {error.explanation}") from error

    # -- helpers --------------------------------------------------------------------------------
    def _containers(self, job_name: str) -> list[Any]:
        try:
            containers = self._client.containers.list(all=True, filters={"label": f"{JOB_LABEL}={job_name}"})
        except Exception as error:  # noqa: BLE001 - engine gone: say so in the launcher's terms
            raise LauncherError(f"cannot list containers of job {job_name!r}: {error}") from error
        # Newest first, so a role that was somehow started twice reports its latest container.
        return sorted(containers, key=lambda c: c.attrs.get("Created", ""), reverse=True)

    @staticmethod
    def _role(container: Any) -> str:
        return container.labels.get(ROLE_LABEL, container.name)

    def _check_network(self) -> None:
        if self._network is None:
            return
        docker = _docker_sdk()

        try:
            self._client.networks.get(self._network)
        except docker.errors.NotFound:
            raise LauncherError(
                f"docker network {self._network!r} (TRAINGUARD_DOCKER_NETWORK) does not exist; "
                "start the compose stack or create it with `docker network create`"
            ) from None

    def _ensure_volumes(self, job_name: str, component: ComponentSpec) -> None:
        docker = _docker_sdk()

        for source in component.volumes:
            if "/" in source:
                continue  # a host path, bind-mounted as is
            try:
                self._client.volumes.get(source)
            except docker.errors.NotFound:
                self._client.volumes.create(name=source, labels={JOB_LABEL: job_name})

    def _run(self, job_name: str, component: ComponentSpec) -> Any:
        options: dict[str, Any] = {
            "name": container_name(job_name, component.role),
            "command": list(component.command),
            "environment": dict(component.environment),
            "labels": {JOB_LABEL: job_name, ROLE_LABEL: component.role},
            "volumes": {source: {"bind": target, "mode": "rw"} for source, target in component.volumes.items()},
            "init": self._init,
            # Least privilege for every component (the docker proxy refuses containers without it):
            # no capabilities, no setuid escalation, a bounded number of processes.
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": _PIDS_LIMIT,
            "cpu_shares": self.cpu_shares,
        }
        if component.cpus is not None:
            options["nano_cpus"] = int(component.cpus * 1e9)
        if component.memory_mb is not None:
            options["mem_limit"] = f"{int(component.memory_mb)}m"
        if component.working_dir:
            options["working_dir"] = component.working_dir
        if self._user:
            options["user"] = self._user
        if self._network:
            options["network"] = self._network
        if component.role == "uploader":
            # The uploader resumes from its state file: if it crashes, let the engine restart it
            # rather than fail the job (a `docker stop`/`docker kill` is not restarted).
            options["restart_policy"] = {"Name": "on-failure", "MaximumRetryCount": 5}
        # create + start, not run: run() would try to pull a missing image from a registry.
        container = self._client.containers.create(component.image, **options)
        container.start()
        return container

    @staticmethod
    def _discard(containers: Iterable[Any]) -> None:
        """Remove containers a failed start created, so a retry starts clean."""
        for container in containers:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - best effort: the original error is what matters
                pass
