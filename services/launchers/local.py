"""Local-process launcher: each component is a subprocess in its own process group.

Layout under ``root`` (one directory per job, one per component)::

    <root>/<job>/<component dir>/spec.json     the ComponentSpec (role, command, environment...)
                                 output.log    stdout + stderr
                                 pid           the wrapper's pid and its /proc start time
                                 exit_code     written by the wrapper when the command ends
                                 kill_at       SIGKILL deadline of a pending stop (epoch seconds)
                                 reason        why it ended, when the launcher knows better

    <root>/<job>/identity.json                 the uid/gid the job runs as (service running as root)

Every command runs under a tiny wrapper (``python -c _WRAPPER``) that is the group leader: it
starts the command, waits for it and writes the exit code to a file. So an exit that happens
while the API is down is not lost, and a restarted API finds everything again from the files
(``jobs()``/``status()``). The wrapper ignores SIGTERM itself (the command in its group receives
it) so it lives to record the exit code; a SIGKILL of the group is recorded by the launcher.

A job is not the API (see :mod:`~trainguard.services.launchers.local_isolation`): its commands get
a scrubbed environment, run in the job's workspace and, when the service is root, as the job's own
uid. The wrapper keeps the launcher's identity (it writes the files above, which the job must not
forge) and drops to the job's uid in the forked child, before it creates the working directory
and execs the command.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainguard.services.launchers.base import (
    ComponentSpec,
    ComponentState,
    ComponentStatus,
    JobLaunch,
    LauncherError,
    LauncherSupport,
    bounded_int,
    read_host_file,
)
from trainguard.services.launchers.local_isolation import (
    JobIdentity,
    JobIsolation,
    job_environment,
    passthrough_names,
)
from trainguard.services.launchers.log_tail import read_log

__all__ = ["LocalLauncher"]

log = logging.getLogger("trainguard.launchers.local")

# The wrapper: argv = [dir, identity JSON ("" for none), working dir, command...]. A no-op Python
# handler (not SIG_IGN, which the command would inherit through exec) keeps the wrapper alive
# through the group's SIGTERM. The child drops to the job's uid before it touches the working
# directory, so a link the job planted there is followed with the job's rights, not the wrapper's.
# An exec failure comes back through a close-on-exec pipe.
_WRAPPER = r"""
import json, os, signal, sys
directory, identity, working_dir, command = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGINT, lambda *_: None)
failure_read, failure_write = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.close(failure_read)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(number, signal.SIG_DFL)
        if identity:
            ids = json.loads(identity)
            os.setgroups([])
            os.setresgid(ids["gid"], ids["gid"], ids["gid"])
            os.setresuid(ids["uid"], ids["uid"], ids["uid"])
        os.makedirs(working_dir, exist_ok=True)
        os.chdir(working_dir)
        os.execvp(command[0], command)
    except BaseException as error:
        text = getattr(error, "strerror", None) or str(error)
        os.write(failure_write, f"{type(error).__name__}: {text}".encode(errors="replace")[:2000])
    os._exit(127)
os.close(failure_write)
failure = b""
while True:
    chunk = os.read(failure_read, 4096)
    if not chunk:
        break
    failure += chunk
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
code, reason = os.waitstatus_to_exitcode(status), ""
if failure:
    reason = f"cannot start {command[0]!r}: {failure.decode(errors='replace')}"
    print(f"trainguard launcher: {reason}", flush=True)
    code = 127
elif code < 0:
    reason = f"killed by {signal.Signals(-code).name}"
    code = 128 - code
temporary = os.path.join(directory, "exit_code.tmp")
with open(temporary, "w") as handle:
    handle.write(f"{code}\n{reason}\n")
os.replace(temporary, os.path.join(directory, "exit_code"))
"""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _component_dir_name(role: str) -> str:
    return _SAFE.sub("_", role.replace(":", "--"))


def _process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: distinguishes our process from a later one with its pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _alive(pid: int, start_time: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        state = state[state.rfind(")") + 2 :].split()[0]
        if state in ("Z", "X"):
            return False
    except OSError:
        pass
    current = _process_start_time(pid)
    return start_time is None or current is None or current == start_time


class LocalLauncher:
    """Runs components as local processes; state lives in files under ``root``."""

    name = "local"
    support = LauncherSupport()  # one instance per job, working directories on this machine

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        python: str | None = None,
        niceness: int | None = None,
        job_uid_base: int | None = None,
    ) -> None:
        """``niceness``: CPU priority of job processes (default TRAINGUARD_JOB_NICENESS, else 10).
        ``job_uid_base``: where the range of job uids starts (default TRAINGUARD_JOB_UID_BASE).

        Job processes (training, uploader, rule runners) run below the control API so that the
        API stays responsive however many jobs run: 100 jobs on 2 cores made creates wait seconds.
        The directory above ``root`` is the service's state (the data dir): the launcher opens
        its directories for traversal (o+x, never o+r) on the way to a job's workspace in it.
        """
        self.niceness = bounded_int(niceness, "TRAINGUARD_JOB_NICENESS", 10, 0, 19, "niceness")
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.python = python or sys.executable
        self.environment_passthrough = passthrough_names(os.environ)
        self.isolation = JobIsolation(self.root.parent, self.python, uid_base=job_uid_base)
        if not self.isolation.available:
            log.warning("local jobs are not isolated from the service: %s", self.isolation.unavailable)
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # reaped on status() to avoid zombies
        self._lock = threading.Lock()

    # -- helpers --------------------------------------------------------------------------------
    def _job_dir(self, job_name: str) -> Path:
        if not job_name or _SAFE.search(job_name):
            raise LauncherError(f"job name {job_name!r} is not usable as a directory name")
        return self.root / job_name

    def _component_dirs(self, job_name: str) -> dict[str, Path]:
        found: dict[str, Path] = {}
        job_dir = self._job_dir(job_name)
        if not job_dir.is_dir():
            return found
        for directory in sorted(job_dir.iterdir()):
            spec_file = directory / "spec.json"
            try:
                role = json.loads(spec_file.read_text())["role"]
            except (OSError, ValueError, KeyError):
                continue
            found[role] = directory
        return found

    def _read_pid(self, directory: Path) -> tuple[int, str | None] | None:
        try:
            pid_text, _, start = (directory / "pid").read_text().partition("\n")
            return int(pid_text), start.strip() or None
        except (OSError, ValueError):
            return None

    def _reap(self) -> None:
        with self._lock:
            for pid, child in list(self._children.items()):
                if child.poll() is not None:
                    del self._children[pid]

    # -- Launcher interface ---------------------------------------------------------------------
    def start(self, job: JobLaunch) -> None:
        job_dir = self._job_dir(job.job_name)
        job_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        workspace = Path(job.workspace).resolve() if job.workspace else job_dir / "workspace"
        with self._lock:
            identity = self.isolation.identity_for(job_dir)
        fresh = not any((job_dir / _component_dir_name(c.role) / "pid").exists() for c in job.components)
        if fresh:
            self.isolation.prepare_workspace(workspace, identity)
        for component in job.components:
            self._start_component(job_dir, workspace, identity, component)

    def _start_component(
        self, job_dir: Path, workspace: Path, identity: JobIdentity | None, component: ComponentSpec
    ) -> None:
        directory = job_dir / _component_dir_name(component.role)
        if (directory / "pid").exists():
            return  # already started: start() is idempotent
        if not component.command:
            raise LauncherError(f"component {component.role!r} has no command (the local launcher runs no images)")
        working_dir = self._working_dir(workspace, component.role, component.working_dir)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)  # its files (pid, exit_code, spec.json) are the launcher's, not the job's
        spec = {
            "role": component.role,
            "command": list(component.command),
            "environment": dict(component.environment),
            "working_dir": component.working_dir,
            "workspace": str(workspace),
            "started_at": time.time(),
        }
        (directory / "spec.json").write_text(json.dumps(spec, indent=2))
        self._spawn(directory, component.role, component.command, component.environment, workspace, working_dir,
                    identity)  # fmt: skip

    @staticmethod
    def _working_dir(workspace: Path, role: str, working_dir: str | None) -> Path:
        """A relative working directory is the workspace's, never the API's; '..' may not leave it."""
        if not working_dir:
            return workspace
        if "\x00" in working_dir or ".." in Path(working_dir).parts:
            raise LauncherError(f"component {role!r}: working_dir {working_dir!r} must not contain '..'")
        return workspace / working_dir  # an absolute one stays as it is: the planner chose it

    def _spawn(
        self,
        directory: Path,
        role: str,
        command: Sequence[str],
        environment: Mapping[str, str],
        workspace: Path,
        working_dir: Path,
        identity: JobIdentity | None,
    ) -> None:
        scrubbed = job_environment(environment, workspace, identity, extra_names=self.environment_passthrough)
        identity_json = json.dumps({"uid": identity.uid, "gid": identity.gid}) if identity else ""
        wrapper_argv = [str(directory), identity_json, str(working_dir), *command]
        with open(directory / "output.log", "ab") as log:
            try:
                child = subprocess.Popen(
                    # -I -S: the wrapper needs no site-packages; skipping them halves its start-up
                    # (10 ms instead of 40 ms of CPU here), paid once per component of every job.
                    [*self._nice_prefix(), self.python, "-I", "-S", "-c", _WRAPPER, *wrapper_argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=scrubbed,
                    cwd=directory,
                    # Its own process group, so stop() signals the whole tree; but not its own
                    # session: with the kernel's autogroup scheduling (on by default on desktop and
                    # many server kernels) every session gets an equal share of the CPU whatever
                    # its niceness (even SCHED_IDLE), so N jobs in N sessions would leave the API
                    # 1/(N+1) of it. In the API's session the niceness below does what it says.
                    process_group=0,
                )
            except OSError as error:
                raise LauncherError(f"cannot start {role}: {error}") from error
        start_time = _process_start_time(child.pid)
        (directory / "pid").write_text(f"{child.pid}\n{start_time or ''}\n")
        with self._lock:
            self._children[child.pid] = child

    def _nice_prefix(self) -> list[str]:
        # `nice` execs the wrapper in the same process, so the recorded pid stays the wrapper's.
        nice = shutil.which("nice") if self.niceness else None
        return [nice, "-n", str(self.niceness)] if nice else []

    def restart(self, job_name: str, role: str) -> None:
        """Run an exited component's recorded spec again in the same directory (its log goes on)."""
        directory = self._component_dirs(job_name).get(role)
        if directory is None:
            raise LauncherError(f"job {job_name!r} has no component {role!r} to restart")
        if self._component_status(role, directory).state is ComponentState.RUNNING:
            return
        spec = json.loads((directory / "spec.json").read_text())
        job_dir = directory.parent
        workspace = Path(spec.get("workspace") or job_dir / "workspace")
        known_identity = (job_dir / "identity.json").exists()
        with self._lock:
            identity = self.isolation.identity_for(job_dir)
        if identity is not None and not known_identity:  # started before jobs had users of their own
            self.isolation.prepare_workspace(workspace, identity)
        working_dir = self._working_dir(workspace, role, spec.get("working_dir"))
        for name in ("exit_code", "kill_at", "reason", "pid"):
            (directory / name).unlink(missing_ok=True)
        restarts = int(self._read_text(directory / "restarts") or 0) + 1
        (directory / "restarts").write_text(f"{restarts}\n")
        with open(directory / "output.log", "ab") as log:
            log.write(f"trainguard launcher: restarting {role} (restart {restarts})\n".encode())
        self._spawn(directory, role, spec["command"], spec.get("environment") or {}, workspace, working_dir, identity)

    def status(self, job_name: str) -> dict[str, ComponentStatus]:
        self._reap()
        statuses: dict[str, ComponentStatus] = {}
        for role, directory in self._component_dirs(job_name).items():
            statuses[role] = self._component_status(role, directory)
        return statuses

    def _component_status(self, role: str, directory: Path) -> ComponentStatus:
        exit_file = directory / "exit_code"
        pid_info = self._read_pid(directory)
        if pid_info is None:
            return ComponentStatus(role, ComponentState.PENDING)
        pid, start_time = pid_info
        if not exit_file.exists() and _alive(pid, start_time):
            self._enforce_kill_deadline(directory, pid)
            return ComponentStatus(role, ComponentState.RUNNING)
        if exit_file.exists():
            code_text, _, reason = exit_file.read_text().partition("\n")
            known_reason = self._read_text(directory / "reason")
            return ComponentStatus(role, ComponentState.EXITED, int(code_text), known_reason or reason.strip())
        # The wrapper is gone without writing its exit code: killed with its group.
        known_reason = self._read_text(directory / "reason")
        return ComponentStatus(
            role, ComponentState.EXITED, 137, known_reason or "the process group was killed (no exit code recorded)"
        )

    @staticmethod
    def _read_text(path: Path) -> str:
        try:
            return path.read_text().strip()
        except OSError:
            return ""

    def _enforce_kill_deadline(self, directory: Path, pid: int) -> None:
        """SIGKILL a group whose stop grace is over (also after an API restart)."""
        deadline_text = self._read_text(directory / "kill_at")
        if not deadline_text:
            return
        deadline, _, grace = deadline_text.partition(" ")
        if time.time() < float(deadline):
            return
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        (directory / "reason").write_text(f"killed by SIGKILL after {float(grace or 0):g} s grace\n")

    def stop(self, job_name: str, roles: tuple[str, ...] | None = None, grace_seconds: float = 120.0) -> None:
        targets = []
        for role, directory in self._component_dirs(job_name).items():
            if roles is not None and role not in roles:
                continue
            status = self._component_status(role, directory)
            if status.state is not ComponentState.RUNNING:
                continue
            pid_info = self._read_pid(directory)
            if pid_info is None:
                continue
            if not (directory / "kill_at").exists():
                (directory / "kill_at").write_text(f"{time.time() + grace_seconds} {grace_seconds}\n")
            try:
                os.killpg(pid_info[0], signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                continue
            targets.append(directory)
        if targets:
            # Enforce the deadline from a timer too, so a stop completes even if nobody polls.
            timer = threading.Timer(grace_seconds + 0.05, self._kill_overdue, args=(targets,))
            timer.daemon = True
            timer.start()

    def _kill_overdue(self, directories: list[Path]) -> None:
        for directory in directories:
            pid_info = self._read_pid(directory)
            if pid_info and not (directory / "exit_code").exists() and _alive(*pid_info):
                self._enforce_kill_deadline(directory, pid_info[0])
        self._reap()

    def logs(self, job_name: str, role: str = "training", tail: int | None = None) -> str:
        directory = self._component_dirs(job_name).get(role)
        if directory is None:
            return ""
        # A tail is read from the end: a describe of a job with a huge log reads its tail only.
        return read_log(directory / "output.log", tail)

    def read_file(self, job_name: str, role: str, path: str, max_bytes: int) -> bytes | None:
        """Components are processes on this machine: ``path`` is a path here."""
        return read_host_file(path, max_bytes)

    def jobs(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self._component_dirs(p.name))

    def remove(self, job_name: str) -> None:
        statuses = self.status(job_name)
        running = [role for role, status in statuses.items() if status.state is ComponentState.RUNNING]
        if running:
            raise LauncherError(f"job {job_name} still has running components: {', '.join(running)}; stop it first")
        shutil.rmtree(self._job_dir(job_name), ignore_errors=True)
