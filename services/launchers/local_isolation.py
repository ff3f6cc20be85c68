"""What keeps a local job apart from the API that launched it.

A job of the local launcher is code the API must not trust. It gets:

* an environment built from an allow-list (PATH, the locale, the time zone, GPU selection...),
  its own variables and the job-scoped ones the planner gives it, with HOME and TMPDIR in its own
  directory: nothing of the API's own environment (its token, its keys, its database URL, its
  cloud credentials) comes through;
* its own directory (the workspace), where relative working directories are resolved;
* when the service runs as root (with CAP_SETUID, CAP_SETGID, CAP_CHOWN): its own unprivileged
  uid and gid, no supplementary groups, and the workspace chowned to them, so the modes of the
  API's files (data dir and database 0700/0600, credentials and keys files 0600) keep it out.

Without root the job runs as the API's user, with the API's rights on its files: :class:`JobIsolation`
says why (``unavailable``), ``trainguard serve`` says so at its start, and a service with more
than one tenant refuses to start unless the operator opts in (TRAINGUARD_LOCAL_UNISOLATED_TENANTS=1).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.services.launchers.base import LauncherError, bounded_int

__all__ = [
    "JobIdentity",
    "JobIsolation",
    "job_environment",
    "create_in_workspace",
    "passthrough_names",
    "unisolated_tenants_refusal",
]

# Numbers of the capabilities the switch needs (linux/capability.h).
_CAP_CHOWN, _CAP_SETGID, _CAP_SETUID = 0, 6, 7
# Job uids come from a range no distribution or subordinate-uid default hands out, below 2**31 so
# that tools keeping uids in a signed int show them right. Each job gets the next one.
_DEFAULT_UID_BASE = 2_100_000_000
_UID_SPAN = 40_000_000

# What a job inherits from the API's environment: how to find programs and libraries (PYTHONPATH:
# a rule runner imports the rule modules the API validated), the locale, the GPUs it may use.
# Everything else is the API's and stays with it.
_PASSED_NAMES = frozenset({
    "PATH", "PYTHONPATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS",
})  # fmt: skip
_PASSED_PREFIXES = ("LC_",)
# Never passed through, whatever the operator lists: the service's secrets and settings.
_NEVER_PASSED_PREFIXES = ("TRAINGUARD_", "AWS_", "S3_", "CLOUDWATCH_", "RAY_")


def passthrough_names(environ: Mapping[str, str]) -> frozenset[str]:
    """TRAINGUARD_JOB_ENV_PASSTHROUGH: more variable names the operator lets jobs inherit."""
    raw = environ.get("TRAINGUARD_JOB_ENV_PASSTHROUGH", "")
    names = frozenset(name.strip() for name in raw.split(",") if name.strip())
    refused = sorted(name for name in names if name.upper().startswith(_NEVER_PASSED_PREFIXES))
    if refused:
        raise LauncherError(
            f"TRAINGUARD_JOB_ENV_PASSTHROUGH names {', '.join(refused)}: the service's own settings and "
            "credentials never reach a job; give a job what it needs in its spec's environment"
        )
    return names


def unisolated_tenants_refusal(tenants: int, environ: Mapping[str, str]) -> str:
    """Why a service whose local jobs run as its own user refuses ``tenants`` access keys ("": it
    does not). One tenant's jobs could read another's secrets and jobs (and the service's); the
    operator may accept that for a trusted group with TRAINGUARD_LOCAL_UNISOLATED_TENANTS=1."""
    if tenants <= 1 or (environ.get("TRAINGUARD_LOCAL_UNISOLATED_TENANTS") or "").strip() == "1":
        return ""
    return (
        f"{tenants} access keys (tenants) are configured, but local jobs run as the service's user: each "
        "tenant's jobs could read the others' keys and jobs. Run the service as root (jobs then run as "
        "users of their own), use the docker launcher, keep one key, or accept it explicitly with "
        "TRAINGUARD_LOCAL_UNISOLATED_TENANTS=1"
    )


@dataclass(frozen=True)
class JobIdentity:
    """The uid and gid one job runs as."""

    uid: int
    gid: int

    @property
    def user_name(self) -> str:
        return f"trainguard-job-{self.uid}"


def job_environment(
    own: Mapping[str, str],
    workspace: Path,
    identity: JobIdentity | None,
    *,
    inherited: Mapping[str, str] | None = None,
    extra_names: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """A job's whole environment: the allow-listed part of ``inherited`` (the API's), its home and
    temporary directory in ``workspace``, and ``own`` (the component's variables) on top."""
    inherited = os.environ if inherited is None else inherited
    environment = {
        name: value
        for name, value in inherited.items()
        if (name in _PASSED_NAMES or name.startswith(_PASSED_PREFIXES) or name in extra_names)
        and not name.upper().startswith(_NEVER_PASSED_PREFIXES)
    }
    environment.setdefault("PATH", os.defpath)
    environment["HOME"] = str(workspace)
    environment["TMPDIR"] = str(workspace / "tmp")
    if identity is not None:
        # No passwd entry names the uid; getpass.getuser() and friends read these first.
        environment["USER"] = environment["LOGNAME"] = identity.user_name
    environment.update(own)
    return environment


def _effective_capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def _mode(path: Path) -> str:
    try:
        return f"mode {stat.S_IMODE(path.stat().st_mode):04o}"
    except OSError as error:
        return error.strerror or str(error)


class JobIsolation:
    """Gives each job its own uid (when the service can) and its workspace.

    ``unavailable`` is "" when jobs run as their own users, else why they cannot (read once, at
    construction: not root, a missing capability, an interpreter or data dir another user cannot
    reach).
    """

    def __init__(self, state_root: Path, python: str, *, uid_base: int | None = None) -> None:
        """``state_root``: the directory whose subdirectories hold the service's state (the data
        dir); the workspaces' parents inside it are made traversable (never listable) for jobs."""
        self.state_root = state_root
        self.uid_base = bounded_int(
            uid_base, "TRAINGUARD_JOB_UID_BASE", _DEFAULT_UID_BASE, 1000, 2**31 - 1 - _UID_SPAN, "job uid base"
        )
        self.unavailable = self._why_unavailable(python)

    @property
    def available(self) -> bool:
        return not self.unavailable

    def _why_unavailable(self, python: str) -> str:
        if os.geteuid() != 0:
            return f"the service runs as uid {os.geteuid()}, not root: jobs run as its user, with its rights"
        needed = {"CAP_SETUID": _CAP_SETUID, "CAP_SETGID": _CAP_SETGID, "CAP_CHOWN": _CAP_CHOWN}
        missing = [name for name, bit in needed.items() if not _effective_capabilities() & (1 << bit)]
        if missing:
            return f"the service runs as root without {', '.join(missing)}: jobs run as root"
        # The real test: can an unprivileged uid run the interpreter and reach the data dir?
        probe = "import os, sys; os.stat(sys.argv[1])"
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", probe, str(self.state_root)],
                user=self.uid_base, group=self.uid_base, extra_groups=[], cwd="/", env={"PATH": os.defpath},
                stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as error:
            blocked = self._first_closed_ancestor(Path(python).resolve()) or self._first_closed_ancestor(
                self.state_root
            )
            where = f" ({blocked[0]} is {blocked[1]}: others cannot traverse it)" if blocked else ""
            return (
                f"an unprivileged user cannot run {python} or reach {self.state_root}{where}: {error}; "
                "jobs run as root. Make the interpreter and the data dir's parents traversable (o+x) "
                "to isolate them"
            )
        return ""

    @staticmethod
    def _first_closed_ancestor(path: Path) -> tuple[Path, str] | None:
        for ancestor in reversed(path.parents):
            try:
                if not ancestor.stat().st_mode & stat.S_IXOTH:
                    return ancestor, _mode(ancestor)
            except OSError:
                return ancestor, "unreadable"
        return None

    # -- identities -------------------------------------------------------------------------------
    def identity_for(self, job_state_dir: Path) -> JobIdentity | None:
        """The job's identity, allocated on its first start and kept in ``job_state_dir``
        (the launcher's own directory of the job, which the job cannot write)."""
        if not self.available:
            return None
        recorded = job_state_dir / "identity.json"
        try:
            document = json.loads(recorded.read_text())
            return JobIdentity(int(document["uid"]), int(document["gid"]))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LauncherError(f"{recorded} is unreadable ({error}): cannot tell which user the job runs as") from None
        uid = self._next_uid(job_state_dir.parent / ".next-job-uid")
        identity = JobIdentity(uid, uid)
        temporary = recorded.with_suffix(".tmp")
        temporary.write_text(json.dumps({"uid": identity.uid, "gid": identity.gid}))
        os.replace(temporary, recorded)
        return identity

    def _next_uid(self, counter: Path) -> int:
        """The next uid of the range, never one a previous job had (until the range wraps)."""
        descriptor = os.open(counter, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(descriptor, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            text = handle.read().strip()
            offset = int(text) if text.isdigit() else 0
            handle.seek(0)
            handle.truncate()
            handle.write(f"{(offset + 1) % _UID_SPAN}\n")
            handle.flush()
            os.fsync(handle.fileno())
        # The first uid of the range is the construction probe's; jobs start after it.
        return self.uid_base + 1 + offset % (_UID_SPAN - 1)

    # -- workspaces -------------------------------------------------------------------------------
    def prepare_workspace(self, workspace: Path, identity: JobIdentity | None) -> None:
        """Create the workspace (and its tmp) and hand everything in it to the job's user."""
        workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
        (workspace / "tmp").mkdir(exist_ok=True, mode=0o700)
        if identity is None:
            return
        self._open_the_way(workspace)
        # What the API wrote before the start (the hook config, the contract's files) becomes the
        # job's; links are chowned themselves, never followed.
        for directory, names, files in os.walk(workspace):
            os.lchown(directory, identity.uid, identity.gid)
            for name in (*names, *files):
                os.lchown(os.path.join(directory, name), identity.uid, identity.gid)
        os.chmod(workspace, 0o700)

    def _open_the_way(self, workspace: Path) -> None:
        """Let the job's user traverse (never list) the service's directories above its workspace."""
        for ancestor in reversed(workspace.parents):
            info = ancestor.stat()
            if info.st_mode & stat.S_IXOTH:
                continue
            inside_state = ancestor == self.state_root or self.state_root in ancestor.parents
            if not inside_state or info.st_uid != os.geteuid():
                raise LauncherError(
                    f"the job's user cannot reach its directory {workspace}: {ancestor} is {_mode(ancestor)} "
                    "and not the service's to open (chmod o+x it, or keep workspaces under the data dir)"
                )
            os.chmod(ancestor, stat.S_IMODE(info.st_mode) | stat.S_IXOTH)


def create_in_workspace(workspace: Path, *parts: str) -> bool:
    """Create the empty file ``workspace/parts...`` (and missing directories on the way) for the
    service, in a directory a job owns: no link on the way is followed (the job may have planted
    one to make the service create a file elsewhere), and what is created belongs to the
    workspace's owner. False when the file existed already."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(workspace, flags)
    try:
        owner = os.fstat(descriptor)
        for name in parts[:-1]:
            try:
                os.mkdir(name, 0o700, dir_fd=descriptor)
                os.chown(name, owner.st_uid, owner.st_gid, dir_fd=descriptor, follow_symlinks=False)
            except FileExistsError:
                pass
            child = os.open(name, flags, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = child
        try:
            created = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=descriptor)  # fmt: skip
        except FileExistsError:
            return False
        else:
            try:
                os.fchown(created, owner.st_uid, owner.st_gid)
            finally:
                os.close(created)
            return True
    finally:
        os.close(descriptor)
