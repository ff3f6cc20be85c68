"""The checks of a hook's constructor arguments that need no hook: each returns the value the
hook keeps, or raises a ConfigError that names the argument (before training starts)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.config.capture_config import DEFAULT_MAX_PENDING_BYTES
from trainguard.config.collections import CollectionManager, compile_regex
from trainguard.errors import ConfigError, StorageError
from trainguard.format.layout import END_OF_TRAINING
from trainguard.hooks.overhead_budget import DEFAULT_MAX_INTERVAL, OverheadBudget
from trainguard.storage import LocalStore, Store
from trainguard.writer.kinds import WRITER_KINDS

__all__ = ["capture_arguments", "check_out_dir", "included_collections", "overhead_budget_of", "writer_kind_of"]


# A hook constructor's capture arguments and their defaults: the CaptureConfig fields of the same
# names. A config given as ``config=`` takes the place of every one of them.
_CAPTURE_DEFAULTS: dict[str, Any] = {
    "out_dir": None, "export_tensorboard": False, "tensorboard_dir": None, "reduction_config": None,
    "save_config": None, "include_regex": None, "include_collections": None, "save_all": False,
    "include_workers": "one", "max_pending_bytes": DEFAULT_MAX_PENDING_BYTES, "other_workers_collections": None,
    "writer": None, "overhead_budget": None, "overhead_max_interval": None, "endpoint_url": None,
    "profile": None, "region": None,
}  # fmt: skip


def capture_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The capture settings among a hook constructor's ``arguments`` (its ``locals()``) that are
    not at their defaults, as :class:`CaptureConfig` keyword arguments."""
    given = {}
    for name, default in _CAPTURE_DEFAULTS.items():
        value = arguments.get(name, default)
        if value is default or (type(value) is type(default) and value == default):
            continue
        given[name] = value
    return given


def writer_kind_of(writer: str | None, default: str) -> str:
    """The writer kind asked for (the argument, else ``TRAINGUARD_WRITER``, else ``default``)."""
    writer = writer or os.environ.get("TRAINGUARD_WRITER") or default
    if writer not in WRITER_KINDS:
        raise ConfigError(f"writer={writer!r} (or TRAINGUARD_WRITER) is invalid: use {', '.join(WRITER_KINDS)}")
    return writer


def overhead_budget_of(overhead_budget: float | None, overhead_max_interval: int | None) -> OverheadBudget | None:
    if overhead_max_interval is not None and (type(overhead_max_interval) is not int or overhead_max_interval < 1):
        raise ConfigError(f"overhead_max_interval={overhead_max_interval!r} must be a whole number of steps >= 1")
    if not overhead_budget:
        return None
    try:
        return OverheadBudget(float(overhead_budget), max_interval=overhead_max_interval or DEFAULT_MAX_INTERVAL)
    except (TypeError, ValueError):
        raise ConfigError(f"overhead_budget={overhead_budget!r} must be a fraction between 0 and 1") from None


def included_collections(
    manager: CollectionManager,
    include_collections: Sequence[str] | None,
    include_regex: Sequence[str] | str | None,
    save_all: bool,
    defaults: Sequence[str],
    always_included: Sequence[str],
) -> list[str]:
    """The names of the collections the hook saves; ``include_regex`` and ``save_all`` add their
    patterns to ``manager``'s ``default`` and ``all`` collections."""
    if isinstance(include_regex, str):
        include_regex = [include_regex]
    for pattern in include_regex or []:
        compile_regex(pattern, "include_regex")
        manager.get("default").include(pattern)
    if save_all:
        manager.get("all").include(".*")
    names = list(include_collections) if include_collections is not None else list(defaults)
    if save_all and "all" not in names:
        names.append("all")
    if include_regex and "default" not in names:
        names.append("default")
    for name in always_included:
        if name not in names:
            names.append(name)
    unknown = [name for name in names if name not in manager]
    if unknown:
        raise ConfigError(
            f"unknown collection(s) {', '.join(map(repr, unknown))} in include_collections: "
            f"known collections are {', '.join(manager.names())}; "
            "add your own with hook.get_collection(name).include(regex) before training"
        )
    return names


def check_out_dir(store: Store, out_dir: str) -> None:
    """Refuse a finished run and an unwritable directory before training starts."""
    try:
        finished = store.exists(END_OF_TRAINING)
    except StorageError as error:
        raise ConfigError(f"cannot use out_dir {out_dir!r}: {error}") from error
    if finished:
        raise ConfigError(
            f"out_dir {out_dir!r} already holds a finished run ({END_OF_TRAINING} exists): "
            "runs are never merged; choose a new out_dir or delete the old run"
        )
    if isinstance(store, LocalStore):
        probe = f".trainguard-write-probe-{os.getpid()}"
        try:
            store.write(probe, b"")
            store.delete(probe)
        except StorageError as error:
            raise ConfigError(f"out_dir {out_dir!r} is not writable: {error}") from error
