"""Stores for runs: local directory, ``s3://`` (any S3-compatible endpoint) and in-memory.

Use :func:`open_store` to get one from a URL; it is the only place that looks at URL schemes.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from trainguard.errors import ConfigError
from trainguard.storage.base import Buffer, Store, StoreWriter
from trainguard.storage.local import LocalStore
from trainguard.storage.memory import MemoryStore

__all__ = [
    "Buffer",
    "LocalStore",
    "MemoryStore",
    "Store",
    "StoreWriter",
    "is_remote",
    "open_store",
    "require_local_path",
    "sidecar_root",
]


def is_remote(url: str | os.PathLike[str]) -> bool:
    return str(url).startswith("s3://")


def sidecar_root(run: str | os.PathLike[str]) -> str:
    """Where a run's ``rule-output/`` and ``profiler-output/`` live: the run itself, or for
    SageMaker's layout (``<job>/debug-output``) the job folder next to it."""
    trimmed = str(run).rstrip("/")
    if trimmed.rsplit("/", 1)[-1] == "debug-output":
        return posixpath.dirname(trimmed) if is_remote(trimmed) else os.path.dirname(trimmed)
    return str(run)


def require_local_path(url: str | os.PathLike[str], what: str = "run") -> None:
    """Raise ConfigError when ``url`` is a local path that does not exist.

    A reader of a run (``rules run``, ``summary``, ...) may be started before training writes
    anything, so an existing but empty directory is worth waiting for; a path that does not exist
    at all is almost always a typo, and waiting for it (or creating it) would hide that. Remote
    URLs are not checked: an S3 prefix exists only once something is written under it.
    """
    text = os.fspath(url)
    if "://" in text and not text.startswith("file://"):
        return
    local = text[len("file://") :] if text.startswith("file://") else text
    if local and not os.path.exists(local):
        raise ConfigError(f"{text}: no such file or directory: no {what} there (check the path)")


def open_store(url: str | os.PathLike[str], **options: Any) -> Store:
    """Open the store a URL names.

    Args:
        url: ``s3://bucket/prefix``, ``memory://name``, ``file:///path`` or a local path.
        options: passed to the store; for S3: ``endpoint_url``, ``profile_name``, ``region_name``,
            ``client`` (see :mod:`trainguard.storage.options`); ignored for other stores.

    Raises:
        ConfigError: the URL is malformed.
        MissingDependencyError: ``s3://`` without boto3 installed.
    """
    text = os.fspath(url)
    if text.startswith("s3://"):
        from trainguard.storage.s3 import S3Store

        return S3Store.from_url(text, **options)
    if text.startswith("memory://"):
        return MemoryStore.named(text[len("memory://") :])
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        raise ConfigError(f"unsupported storage URL {text!r}: use a local path, s3://bucket/prefix or memory://name")
    if not text:
        raise ConfigError("empty storage path: give a directory or an s3:// URL")
    return LocalStore(text)
