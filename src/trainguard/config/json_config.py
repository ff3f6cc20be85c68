"""SageMaker's ``debughookconfig.json`` (a ``DebugHookConfig`` object) -> hook arguments.

Values may be strings or numbers, lists are comma-separated strings, booleans are
``true``/``false`` in any case (smdebug accepted strings for some flags and rejected them for
others; we accept them everywhere). Schedule keys may carry a mode prefix (``train.``,
``eval.``, ``predict.``, ``global.``); the mode-specific value wins. Duplicate
``CollectionName`` entries, which the SageMaker SDK sends, are merged in order: the last value
of each key wins and ``include_regex`` accumulates. Unknown keys are errors, so a typo is
caught before training instead of silently ignored.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.config.collection_names import unknown_collection_error, unknown_collections
from trainguard.config.collections import CollectionManager
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.errors import ConfigError
from trainguard.modes import ModeKeys

__all__ = [
    "DEFAULT_CONFIG_PATH", "configure_collections", "hook_kwargs_from_document", "hook_kwargs_from_json",
    "read_hook_config",
]  # fmt: skip

DEFAULT_CONFIG_PATH = "/opt/ml/input/config/debughookconfig.json"
_SCHEDULE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = {
    "train": ModeKeys.TRAIN,
    "eval": ModeKeys.EVAL,
    "predict": ModeKeys.PREDICT,
    "global": ModeKeys.GLOBAL,
}
_HOOK_KEYS = {
    "save_all", "include_regex", "include_workers", "reductions", "save_raw_tensor", "save_shape",
    "export_tensorboard", "tensorboard_dir", "include_collections", "other_workers_collections",
}  # fmt: skip
logger = logging.getLogger("trainguard")
_COLLECTION_KEYS = {"include_regex", "reductions", "save_raw_tensor", "save_shape", "save_histogram"}


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{key}={value!r} is not a boolean: use true or false")


def _split(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(item).strip() for item in value if str(item).strip()]
    return [part.strip() for part in str(value).split(",") if part.strip()]


def _save_config(params: dict[str, Any], where: str) -> SaveConfig | None:
    """A SaveConfig from (possibly mode-prefixed) schedule keys; None when there are none."""
    base: dict[str, Any] = {}
    per_mode: dict[ModeKeys, dict[str, Any]] = {}
    for key, value in params.items():
        prefix, _, name = key.rpartition(".")
        if name not in _SCHEDULE_KEYS:
            continue
        if prefix and prefix.lower() not in _MODE_PREFIXES:
            raise ConfigError(
                f"unknown mode prefix {prefix!r} in {where} key {key!r}: use train., eval., predict., global."
            )
        target = per_mode.setdefault(_MODE_PREFIXES[prefix.lower()], {}) if prefix else base
        target[name] = value
    if not base and not per_mode:
        return None

    def mode_config(values: dict[str, Any]) -> SaveConfigMode:
        merged = {**base, **values}
        interval = merged.get("save_interval")
        end = merged.get("end_step")
        # SaveConfigMode validates (and converts) each value, with a message naming key and value
        return SaveConfigMode(
            save_interval=interval if interval not in (None, "") else None,
            start_step=merged.get("start_step") or 0,
            end_step=end if end not in (None, "") else None,
            # step strings: SaveConfigMode parses them, with the same message naming key and value
            save_steps=tuple(_split(merged.get("save_steps") or "")),  # type: ignore[arg-type]
        )

    try:
        default = mode_config({})
        return SaveConfig(
            mode_save_configs={mode: mode_config(values) for mode, values in per_mode.items()},
            save_interval=default.save_interval,
            start_step=default.start_step,
            end_step=default.end_step,
            save_steps=default.save_steps,
        )
    except ValueError as error:
        raise ConfigError(f"invalid schedule in {where}: {error}") from None


def _reduction_config(params: dict[str, Any], where: str) -> ReductionConfig | None:
    if "reductions" not in params and "save_raw_tensor" not in params and "save_shape" not in params:
        return None
    return ReductionConfig.from_tokens(
        params.get("reductions") or "",
        save_raw_tensor=parse_bool(
            f"{where} save_raw_tensor", params.get("save_raw_tensor", not params.get("reductions"))
        ),
        save_shape=parse_bool(f"{where} save_shape", params.get("save_shape", False)),
    )


def _check_keys(params: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in params:
        if key.rpartition(".")[2] in _SCHEDULE_KEYS or key in allowed:
            continue
        raise ConfigError(
            f"unknown key {key!r} in {where}: valid keys are {', '.join(sorted(allowed | set(_SCHEDULE_KEYS)))}"
        )


def hook_kwargs_from_document(document: dict[str, Any], *, drop_unknown_collections: bool = False) -> dict[str, Any]:
    """Hook keyword arguments from a parsed DebugHookConfig document.

    A collection name that is neither built in nor given an ``include_regex`` is a ConfigError
    (:mod:`trainguard.config.collection_names`); ``drop_unknown_collections`` (zero-code capture,
    where training has started) drops it with a warning instead."""
    if not isinstance(document, dict):
        raise ConfigError("hook config must be a JSON object (SageMaker's DebugHookConfig)")
    params = dict(document.get("HookParameters") or {})
    _check_keys(params, _HOOK_KEYS, "HookParameters")
    kwargs: dict[str, Any] = {}
    out_dir = document.get("LocalPath") or document.get("out_dir")
    if out_dir:
        kwargs["out_dir"] = out_dir
    if "save_all" in params:
        kwargs["save_all"] = parse_bool("save_all", params["save_all"])
    if "include_regex" in params:
        kwargs["include_regex"] = _split(params["include_regex"])
    if "include_workers" in params:
        kwargs["include_workers"] = str(params["include_workers"])
    if "other_workers_collections" in params:
        # trainguard's addition: what ranks > 0 save under include_workers "one" ("" = nothing)
        kwargs["other_workers_collections"] = _split(params["other_workers_collections"])
    if "export_tensorboard" in params:
        kwargs["export_tensorboard"] = parse_bool("export_tensorboard", params["export_tensorboard"])
    if "tensorboard_dir" in params:
        kwargs["tensorboard_dir"] = str(params["tensorboard_dir"])
    save_config = _save_config(params, "HookParameters")
    if save_config is not None:
        kwargs["save_config"] = save_config
    reduction_config = _reduction_config(params, "HookParameters")
    if reduction_config is not None:
        kwargs["reduction_config"] = reduction_config

    manager = CollectionManager.pytorch_defaults()
    include = _split(params["include_collections"]) if "include_collections" in params else []
    merged = _merged_collections(document.get("CollectionConfigurations") or [])
    include += [name for name in merged if name not in include]
    unknown = unknown_collections(include, [name for name, values in merged.items() if values["include_regex"]])
    if unknown:
        error = unknown_collection_error(unknown, "the hook config")
        if not drop_unknown_collections:
            raise error
        logger.warning("trainguard: %s; capturing without them", error)
        include = [name for name in include if name not in unknown]
        merged = {name: values for name, values in merged.items() if name not in unknown}
    _apply_collections(manager, merged)
    if include:
        defaults = ["weights", "biases", "gradients", "losses", "default", "scalars"]
        kwargs["include_collections"] = (
            include if "include_collections" in params else defaults + [n for n in include if n not in defaults]
        )
    kwargs["collection_manager"] = manager
    return kwargs


def hook_kwargs_from_json(
    path: str | os.PathLike[str] | None = None, *, drop_unknown_collections: bool = False
) -> dict[str, Any]:
    """Read a DebugHookConfig JSON file; the path defaults to ``$SMDEBUG_CONFIG_FILE_PATH``."""
    path = (
        path or os.environ.get("SMDEBUG_CONFIG_FILE_PATH") or os.environ.get("TRAINGUARD_CONFIG") or DEFAULT_CONFIG_PATH
    )
    return hook_kwargs_from_document(read_hook_config(path), drop_unknown_collections=drop_unknown_collections)


def config_file_named() -> bool:
    """Whether :func:`hook_kwargs_from_json` without a path has a file to read (a variable names
    one, or SageMaker's path exists): ``create_from_json_file()`` under ``trainguard run`` takes
    the run's own capture config where it has none."""
    named = os.environ.get("SMDEBUG_CONFIG_FILE_PATH") or os.environ.get("TRAINGUARD_CONFIG")
    return bool(named) or os.path.exists(DEFAULT_CONFIG_PATH)


def read_hook_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The DebugHookConfig document in the file ``path`` (a ConfigError naming it if unreadable)."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError:
        raise ConfigError(f"hook config {path} does not exist: pass the path of a debughookconfig.json") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"hook config {path} is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"hook config {path} must hold a JSON object (SageMaker's DebugHookConfig)")
    return document


def configure_collections(manager: CollectionManager, entries: Sequence[Mapping[str, Any]]) -> CollectionManager:
    """Apply DebugHookConfig ``CollectionConfigurations`` entries (regexes, schedules, reductions)
    to ``manager``'s collections, adding those it lacks; returns ``manager``."""
    _apply_collections(manager, _merged_collections(entries))
    return manager


def _merged_collections(entries: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Each collection's parameters, its entries merged in order (their regexes added up)."""
    merged: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = entry.get("CollectionName") if isinstance(entry, Mapping) else None
        if not name:
            raise ConfigError(f"CollectionConfigurations entry {entry!r} has no CollectionName")
        collection_params = dict(entry.get("CollectionParameters") or {})
        _check_keys(collection_params, _COLLECTION_KEYS, f"collection {name!r}")
        target = merged.setdefault(name, {})
        regexes = target.get("include_regex", []) + _split(collection_params.pop("include_regex", ""))
        target.update(collection_params)
        target["include_regex"] = regexes
    return merged


def _apply_collections(manager: CollectionManager, merged: Mapping[str, Mapping[str, Any]]) -> None:
    for name, collection_params in merged.items():
        collection = manager.get(name)
        collection.include(collection_params["include_regex"])
        collection.save_config = _save_config(dict(collection_params), f"collection {name!r}")
        collection.reduction_config = _reduction_config(dict(collection_params), f"collection {name!r}")
        if "save_histogram" in collection_params:
            collection.save_histogram = parse_bool("save_histogram", collection_params["save_histogram"])
