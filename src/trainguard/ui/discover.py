"""Which runs a dashboard shows: a run directory, a folder of runs, or the same on ``s3://``.

A path is a run when it holds a capture (``collections/``, ``index/``), rule results
(``rule-output/``) or an end marker; otherwise its direct children that are runs are shown (a
folder of runs such as ``trainguard-runs/``, or an S3 prefix of runs). Children are listed with a
delimiter on S3, never by listing every object of the bucket.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import StorageError
from trainguard.format.layout import END_OF_TRAINING
from trainguard.storage import is_remote, open_store
from trainguard.storage.base import Store

__all__ = ["RunLocation", "discover_runs", "modified_at", "run_id"]

DEFAULT_RUNS_DIR = "trainguard-runs"
_RUN_MARKERS = ("collections", "index", "rule-output", "events", END_OF_TRAINING, "debug-output")


def run_id(url: str) -> str:
    """A short stable id for a run's URL (pages link by id, never by path)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunLocation:
    """Where one run lives, and how to open its store."""

    url: str
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        return run_id(self.url)

    @property
    def name(self) -> str:
        parts = self.url.rstrip("/").rsplit("/", 2)
        if parts[-1] == "debug-output" and len(parts) > 1:
            return parts[-2]  # SageMaker's <job>/debug-output: the job's name
        return parts[-1] or self.url

    def open(self) -> Store:
        return open_store(self.url, **self.options)


def _local_is_run(path: Path) -> bool:
    return any((path / marker).exists() for marker in _RUN_MARKERS)


def _s3_children(store: Any) -> tuple[set[str], list[str]]:
    """Names directly under an S3 store's prefix: (folders, objects)."""
    client = store._client  # the store's own client: its endpoint, credentials and retries
    prefix = store.full_key("")
    folders: set[str] = set()
    objects: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix, Delimiter="/"):
            for item in page.get("CommonPrefixes", ()):
                folders.add(item["Prefix"][len(prefix) :].rstrip("/"))
            for item in page.get("Contents", ()):
                objects.append(item["Key"][len(prefix) :])
    except Exception as error:  # noqa: BLE001 - botocore's errors: shown as this path's problem
        raise StorageError(f"cannot list s3://{store.bucket}/{prefix}: {error}") from error
    return folders, objects


def _s3_runs(url: str, options: dict[str, Any]) -> list[RunLocation]:
    store = open_store(url, **options)
    folders, objects = _s3_children(store)
    if folders & set(_RUN_MARKERS) or set(objects) & set(_RUN_MARKERS):
        return [RunLocation(url.rstrip("/"), options)]
    found = []
    for folder in sorted(folders):
        child = f"{url.rstrip('/')}/{folder}"
        sub_folders, sub_objects = _s3_children(open_store(child, **options))
        if "debug-output" in sub_folders:
            found.append(RunLocation(f"{child}/debug-output", options))
        elif sub_folders & set(_RUN_MARKERS) or set(sub_objects) & set(_RUN_MARKERS):
            found.append(RunLocation(child, options))
    return found


def _local_runs(path: Path) -> list[RunLocation]:
    if _local_is_run(path):
        if (path / "debug-output").is_dir() and not (path / "collections").exists():
            return [RunLocation(str((path / "debug-output").absolute()))]
        return [RunLocation(str(path.absolute()))]
    found = []
    try:
        children = sorted(entry for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    except OSError:
        return []
    for child in children:
        if (child / "debug-output").is_dir() and not (child / "collections").exists():
            found.append(RunLocation(str((child / "debug-output").absolute())))
        elif _local_is_run(child):
            found.append(RunLocation(str(child.absolute())))
    return found


def discover_runs(paths: list[str], *, endpoint_url: str | None = None) -> tuple[list[RunLocation], list[str]]:
    """The runs under each path, and a problem line for each path that could not be read."""
    runs: dict[str, RunLocation] = {}
    problems = []
    for text in paths or [DEFAULT_RUNS_DIR]:
        try:
            if is_remote(text):
                options = {"endpoint_url": endpoint_url} if endpoint_url else {}
                found = _s3_runs(text, options)
            else:
                path = Path(os.path.expanduser(text))
                found = _local_runs(path) if path.is_dir() else []
                if not path.exists():
                    problems.append(f"{text}: no such directory (yet)")
        except StorageError as error:
            problems.append(f"{text}: {error}")
            continue
        for location in found:
            runs.setdefault(location.url, location)
    return list(runs.values()), problems


def modified_at(store: Store, key: str) -> float | None:
    """When ``key`` was last written (epoch seconds), or None when unknown or absent."""
    path_of = getattr(store, "path_of", None)
    if path_of is not None:
        try:
            return os.stat(path_of(key)).st_mtime
        except OSError:
            return None
    head = getattr(store, "_head", None)
    if head is None:
        return None
    try:
        stamp = head(key).get("LastModified")
    except Exception:  # noqa: BLE001 - absent or unreadable: unknown
        return None
    return stamp.timestamp() if stamp is not None else None
