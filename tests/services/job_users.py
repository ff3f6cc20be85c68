"""For tests of local jobs running as users of their own (the service as root).

An unprivileged uid must be able to run the interpreter and import the code; where a parent
directory of them is closed (``/root`` 0700 under a pyenv Python), :func:`traversable_for_jobs`
opens it for traversal (o+x, never read) while the test runs and restores its mode afterwards.
"""

from __future__ import annotations

import contextlib
import os
import site
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["needs_root", "traversable_for_jobs"]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="local jobs run as users of their own only when the service is root"
)
REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def traversable_for_jobs(*paths: Path) -> Iterator[None]:
    """o+x on every closed parent of the interpreter, the checkout, site-packages and ``paths``."""
    opened: list[tuple[Path, int]] = []
    try:
        for path in (Path(sys.executable), REPO, *map(Path, site.getsitepackages()), *paths):
            for ancestor in reversed(path.resolve().parents):
                mode = stat.S_IMODE(ancestor.stat().st_mode)
                if not mode & stat.S_IXOTH and all(ancestor != seen for seen, _ in opened):
                    os.chmod(ancestor, mode | stat.S_IXOTH)
                    opened.append((ancestor, mode))
        yield
    finally:
        for path, mode in reversed(opened):
            os.chmod(path, mode)
