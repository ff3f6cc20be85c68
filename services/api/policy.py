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

Each check raises :class:`PolicyError` (a ``ValueError``, so pydantic validators can let it through
as a 422 naming the field) with a message that says what is allowed instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.services.api.settings import Settings

__all__ = ["PolicyError", "SourcePolicy"]

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_CLASS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PolicyError(ValueError):
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
