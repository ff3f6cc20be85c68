"""What a job request may make the API process load or touch (validation calls these before anything starts).

* A rule reference is a built-in name, an installed ``trainguard.rules`` entry point, or
  ``module:Class`` where *module* is on the operator's allow-list (TRAINGUARD_RULE_MODULES, exact
  module or a package prefix). Anything else is refused before it is imported: validating a job
  must never import an arbitrary module into the API process (``os:system`` is not a rule).
  A job's own rule code comes as ``source_uri`` and is loaded by its rule runner, not by the API.
* A rule's ``source_uri`` is ``s3://...`` (fetched by the runner) or a local ``.py`` file under one
  of TRAINGUARD_SOURCE_ROOTS; ``file://`` and other schemes, ``..`` escapes and symlinks out of
  the roots are refused.
* A job's ``working_dir`` stays inside the job's own directory.
* Tenancy (:class:`TenancyPolicy`): a job belongs to the caller that created it; who else may
  read or stop it is the operator's policy file (TRAINGUARD_TENANCY_POLICY_FILE, docs/tenancy.md).

Each check raises :class:`PolicyError` (a ``ValueError``, so pydantic validators can let it through
as a 422 naming the field) with a message that says what is allowed instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from trainguard.services.errors import ServiceError

if TYPE_CHECKING:
    from trainguard.services.api.settings import Settings

__all__ = [
    "OPERATOR",
    "OPERATOR_CALLER",
    "Caller",
    "Grant",
    "PolicyError",
    "SourcePolicy",
    "TenancyPolicy",
    "parse_tenancy_policy",
]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_CLASS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PolicyError(ServiceError, ValueError):
    """A request asks for something the server's policy does not allow."""


def _within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class SourcePolicy:
    rule_modules: tuple[str, ...] = ()
    source_roots: tuple[Path, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> SourcePolicy:
        return cls(rule_modules=tuple(settings.rule_modules), source_roots=tuple(settings.source_roots))

    # -- rule references --------------------------------------------------------------------------
    def module_allowed(self, module: str) -> bool:
        return any(module == allowed or module.startswith(allowed + ".") for allowed in self.rule_modules)

    def check_rule_reference(self, rule: str) -> None:
        """Refuse a ``module:Class`` reference unless its module is allow-listed; names pass (looked up later)."""
        if ":" not in rule:
            return  # a built-in or entry-point name: the registry looks it up without importing user input
        module, _, class_name = rule.partition(":")
        if not _MODULE.match(module) or not _CLASS.match(class_name):
            raise PolicyError(
                f"rule {rule!r}: a custom rule is 'package.module:ClassName' (dotted identifiers, no relative imports)"
            )
        if not self.module_allowed(module):
            allowed = ", ".join(self.rule_modules) or "none configured"
            raise PolicyError(
                f"rule {rule!r}: module {module!r} is not on the server's allow-list (TRAINGUARD_RULE_MODULES: "
                f"{allowed}); use a built-in rule, an installed trainguard.rules entry point, or ship the class "
                "with the job as source_uri"
            )

    # -- rule source files ----------------------------------------------------------------------
    def check_source_uri(self, uri: str) -> None:
        if uri.startswith("s3://"):
            bucket, _, key = uri[len("s3://"):].partition("/")
            if not bucket or not key or not key.endswith(".py"):
                raise PolicyError(f"source_uri {uri!r}: expected s3://bucket/key.py")
            return
        if "://" in uri or uri.startswith("file:"):
            raise PolicyError(
                f"source_uri {uri!r}: only s3://bucket/key.py or a local path under TRAINGUARD_SOURCE_ROOTS"
            )
        if not self.source_roots:
            raise PolicyError(
                f"source_uri {uri!r}: local rule files are disabled on this server (no TRAINGUARD_SOURCE_ROOTS); "
                "upload the file to S3 and give its s3:// URI"
            )
        path = Path(uri)
        if not path.is_absolute() or not uri.endswith(".py"):
            raise PolicyError(f"source_uri {uri!r}: a local rule file must be an absolute path to a .py file")
        resolved = path.resolve()  # follows symlinks: a link out of the roots is refused too
        if not any(_within(resolved, root.resolve()) for root in self.source_roots):
            raise PolicyError(
                f"source_uri {uri!r} is outside the allowed directories ({', '.join(map(str, self.source_roots))})"
            )

    # -- working directories ------------------------------------------------------------------------
    @staticmethod
    def check_working_dir(working_dir: str, job_dir: Path) -> Path:
        """The working directory resolved inside ``job_dir`` (relative paths are taken from it)."""
        if "\x00" in working_dir:
            raise PolicyError("working_dir contains a NUL byte")
        parts = PurePosixPath(working_dir).parts
        if ".." in parts:
            raise PolicyError(f"working_dir {working_dir!r} must not contain '..'")
        root = job_dir.resolve()
        candidate = Path(working_dir)
        resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
        if not _within(resolved, root):
            raise PolicyError(f"working_dir {working_dir!r} must be inside the job's directory {root}")
        return resolved


# -- tenancy: who may see and stop whose jobs ------------------------------------------------------
OPERATOR = "operator"  # the owner of jobs created with TRAINGUARD_API_TOKEN (and of jobs from before tenancy)
_ANY = "*"
_TENANCY_ACTIONS = ("read", "stop")


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the operator (the API token) or an access key, by its name in the keys file."""

    name: str

    @property
    def is_operator(self) -> bool:
        return self.name == OPERATOR


OPERATOR_CALLER = Caller(OPERATOR)


@dataclass(frozen=True)
class Grant:
    """The owners whose jobs a key may read (list, describe, logs) and stop, beyond its own."""

    read: frozenset[str] = frozenset()
    stop: frozenset[str] = frozenset()

    def owners(self, action: str) -> frozenset[str]:
        # Whoever may stop a job may also see it: a stop is answered with the job's status.
        return self.read | self.stop if action == "read" else self.stop


def _owner_list(value: object, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise PolicyError(f"{where}: expected a list of key names (or \"*\" for every owner)")
    return frozenset(item.strip() for item in value)


def parse_tenancy_policy(document: object, where: str) -> dict[str, Grant]:
    """``{"grants": [{"key": NAME, "read": [OWNER, ...], "stop": [OWNER, ...]}, ...]}`` -> grants by key name."""
    if document is None:
        return {}
    if not isinstance(document, dict) or set(document) - {"grants"}:
        raise PolicyError(f"{where}: expected a mapping with one member, 'grants' (a list)")
    entries = document.get("grants") or []
    if not isinstance(entries, list):
        raise PolicyError(f"{where}: 'grants' must be a list")
    grants: dict[str, Grant] = {}
    for index, entry in enumerate(entries):
        label = f"{where}: grants[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not entry["key"].strip():
            raise PolicyError(f"{label}: each grant needs 'key', the name of an access key")
        unknown = set(entry) - {"key", *_TENANCY_ACTIONS}
        if unknown:
            raise PolicyError(f"{label}: unknown member(s) {', '.join(sorted(map(str, unknown)))}; "
                              "a grant has key, read and stop")  # fmt: skip
        key = entry["key"].strip()
        if key == OPERATOR:
            raise PolicyError(f"{label}: the operator sees every job already; grants are for access keys")
        grant = Grant(read=_owner_list(entry.get("read"), f"{label}.read"),
                      stop=_owner_list(entry.get("stop"), f"{label}.stop"))  # fmt: skip
        previous = grants.get(key, Grant())
        grants[key] = Grant(read=previous.read | grant.read, stop=previous.stop | grant.stop)
    return grants


class TenancyPolicy:
    """Who may read and stop which jobs. A job belongs to the caller that created it.

    * The operator (TRAINGUARD_API_TOKEN) reads and stops every job.
    * An access key reads and stops its own jobs, and those of the owners its grants name.
    * A job the caller may not read answers as a job that does not exist (names do not leak).

    Grants come from TRAINGUARD_TENANCY_POLICY_FILE (YAML or JSON; the format is in
    docs/tenancy.md), re-read when the file changes. A file that cannot be read or parsed is a
    configuration error at start; a broken edit later leaves no grants until it is fixed (a key
    then sees its own jobs only), never more than the file said.
    """

    def __init__(self, grants: dict[str, Grant] | None = None, path: str | Path | None = None) -> None:
        import threading

        self._grants = dict(grants or {})
        self._path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        if self._path is not None:
            self._reload()

    @classmethod
    def from_file(cls, path: str | Path | None) -> TenancyPolicy:
        return cls(path=path) if path else cls()

    def _reload(self) -> None:
        import stat

        import yaml

        assert self._path is not None
        info = self._path.stat()
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        where = f"TRAINGUARD_TENANCY_POLICY_FILE {self._path}"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            # Whoever may write the file may grant themselves every job.
            raise PolicyError(f"{where} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): "
                              f"chmod go-w {self._path}")  # fmt: skip
        try:
            document = yaml.safe_load(self._path.read_text())
        except yaml.YAMLError as error:
            raise PolicyError(f"{where}: not YAML or JSON: {error}") from None
        self._grants, self._stamp = parse_tenancy_policy(document, where), stamp

    def _grant(self, key: str) -> Grant:
        if self._path is not None:
            with self._lock:
                try:
                    self._reload()
                except (OSError, PolicyError):
                    self._grants, self._stamp = {}, None  # least privilege until the file is fixed
        return self._grants.get(key, Grant())

    def owners(self, caller: Caller, action: str = "read") -> frozenset[str] | None:
        """The owners whose jobs ``caller`` may ``action`` ("read" or "stop"); None means every owner."""
        if action not in _TENANCY_ACTIONS:
            raise ValueError(f"unknown tenancy action {action!r}")
        if caller.is_operator:
            return None
        granted = self._grant(caller.name).owners(action)
        return None if _ANY in granted else granted | {caller.name}

    def allows(self, caller: Caller, action: str, owner: str | None) -> bool:
        """Whether ``caller`` may ``action`` a job of ``owner`` (a job without an owner is the operator's).

        The one check behind every route that shows or changes a job.
        """
        owners = self.owners(caller, action)
        return owners is None or (owner or OPERATOR) in owners
