"""One capture's settings: what the PyTorch, Keras and XGBoost hooks take, and what ``trainguard
run`` hands the training command as one JSON value (``TRAINGUARD_CAPTURE``), read back there by
:meth:`CaptureConfig.from_json`, the same function that checked it before training started.

    config = CaptureConfig(out_dir="runs/a", save_config=SaveConfig(save_interval=50))
    hook = trainguard.pytorch.Hook(config=config)

Validated when made: a bad value is a ConfigError naming the field, before any hook exists.
Collections configured in a DebugHookConfig (their regexes and schedules) travel as the
document's ``CollectionConfigurations`` entries and are applied to the hook's own collections when
it is made, so a Keras or XGBoost hook keeps its framework's defaults underneath.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig
from trainguard.errors import ConfigError

__all__ = [
    "CAPTURE_VARIABLE", "DEFAULT_MAX_PENDING_BYTES", "ZERO_CODE_COLLECTIONS", "ZERO_CODE_SAVE_INTERVAL",
    "CaptureConfig",
]  # fmt: skip

CAPTURE_VARIABLE = "TRAINGUARD_CAPTURE"
# Zero-code capture saves every 10th step unless told otherwise: often enough for the rules to
# see a fault within a few dozen steps; ``trainguard run --overhead-budget`` spaces it further.
ZERO_CODE_SAVE_INTERVAL = 10
# replica_fingerprints writes only in a distributed run: on by default, as in the PyTorch hook's
ZERO_CODE_COLLECTIONS = (
    "weights", "biases", "gradients", "losses", "outputs", "scalars", "default", "replica_fingerprints",
)  # fmt: skip
DEFAULT_MAX_PENDING_BYTES = 256 << 20
_FORMAT = 1  # of to_json's document: a child of another trainguard version refuses, never misreads


def _names(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{field}={value!r} must be a list of names")
    return tuple(value)


@dataclasses.dataclass(frozen=True, eq=False)
class CaptureConfig:
    """What a hook captures, where, and at what cost. Fields as the hooks' arguments of the same
    names (``trainguard.pytorch.Hook``); ``collection_configurations``: a DebugHookConfig's
    ``CollectionConfigurations`` entries, applied to the hook's collections when it is made."""

    out_dir: str | None = None
    save_config: SaveConfig | None = None
    reduction_config: ReductionConfig | None = None
    include_collections: tuple[str, ...] | None = None
    include_regex: tuple[str, ...] = ()
    save_all: bool = False
    include_workers: str = "one"
    other_workers_collections: tuple[str, ...] | None = None
    export_tensorboard: bool = False
    tensorboard_dir: str | None = None
    writer: str | None = None
    overhead_budget: float | None = None
    overhead_max_interval: int | None = None
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    endpoint_url: str | None = None
    profile: str | None = None
    region: str | None = None
    collection_configurations: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.out_dir is not None:
            try:
                set_(self, "out_dir", os.fspath(self.out_dir))
            except TypeError:
                raise ConfigError(f"out_dir={self.out_dir!r} must be a path or an s3:// URI") from None
            if not isinstance(self.out_dir, str) or not self.out_dir:
                raise ConfigError(f"out_dir={self.out_dir!r} must be a non-empty path or s3:// URI")
        if self.include_workers not in ("one", "all"):
            raise ConfigError(f"include_workers={self.include_workers!r} is invalid: use 'one' or 'all'")
        if self.save_config is not None and not isinstance(self.save_config, SaveConfig):
            raise ConfigError(f"save_config must be a trainguard SaveConfig, got {type(self.save_config).__name__}")
        if self.reduction_config is not None and not isinstance(self.reduction_config, ReductionConfig):
            raise ConfigError(f"reduction_config must be a ReductionConfig, got {type(self.reduction_config).__name__}")
        set_(self, "include_regex", _names("include_regex", self.include_regex or ()))
        from trainguard.config.collections import compile_regex

        for pattern in self.include_regex:
            compile_regex(pattern, "include_regex")
        for field in ("include_collections", "other_workers_collections"):
            if getattr(self, field) is not None:
                set_(self, field, _names(field, getattr(self, field)))
        for field in ("save_all", "export_tensorboard"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(f"{field}={getattr(self, field)!r} must be True or False")
        for field in ("tensorboard_dir", "writer", "endpoint_url", "profile", "region"):
            if getattr(self, field) is not None and not isinstance(getattr(self, field), str):
                raise ConfigError(f"{field}={getattr(self, field)!r} must be a string")
        self._check_budget()
        if type(self.max_pending_bytes) is not int or self.max_pending_bytes < 1:
            raise ConfigError(f"max_pending_bytes={self.max_pending_bytes!r} must be a whole number of bytes >= 1")
        entries = self.collection_configurations or ()
        if not isinstance(entries, Sequence) or not all(isinstance(entry, Mapping) for entry in entries):
            raise ConfigError("collection_configurations must be a list of CollectionConfigurations entries")
        # a deep copy in plain JSON types: the config stays as made, whatever the caller's dicts do
        set_(self, "collection_configurations", tuple(json.loads(json.dumps(list(entries)))))
        if self.collection_configurations:
            from trainguard.config.collections import CollectionManager
            from trainguard.config.json_config import configure_collections

            configure_collections(CollectionManager.pytorch_defaults(), self.collection_configurations)

    def _check_budget(self) -> None:
        budget, interval = self.overhead_budget, self.overhead_max_interval
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < 1:
                raise ConfigError(f"overhead_budget={budget!r} must be a fraction from 0 to below 1")
            object.__setattr__(self, "overhead_budget", float(budget) or None)  # 0: the schedule as configured
        if interval is not None and (type(interval) is not int or interval < 1):
            raise ConfigError(f"overhead_max_interval={interval!r} must be a whole number of steps >= 1")

    def __eq__(self, other: object) -> bool:
        # by value: a SaveConfig compares by identity, its to_dict() by what it holds
        return isinstance(other, CaptureConfig) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def replace(self, **changes: Any) -> CaptureConfig:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    # -- the one serialised form ---------------------------------------------------------------
    def to_json(self) -> str:
        document: dict[str, Any] = {"format": _FORMAT}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "save_config":
                value = value.to_dict() if value is not None else None
            elif field.name == "reduction_config":
                value = dataclasses.asdict(value) if value is not None else None
            elif isinstance(value, tuple):
                value = list(value)
            document[field.name] = value
        return json.dumps(document, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, where: str = CAPTURE_VARIABLE) -> CaptureConfig:
        """The config :meth:`to_json` wrote; a ConfigError naming ``where`` and the field if not."""
        try:
            document = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise ConfigError(f"{where} is not valid JSON: {error}") from None
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise ConfigError(f"{where} is not a capture config of format {_FORMAT} (made by another trainguard?)")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(document) - known - {"format"})
        if unknown:
            raise ConfigError(f"{where} has unknown field(s) {', '.join(unknown)}")
        values = {name: value for name, value in document.items() if name in known}
        try:
            if values.get("save_config") is not None:
                values["save_config"] = SaveConfig.from_dict(values["save_config"])
            if values.get("reduction_config") is not None:
                reduction = values["reduction_config"]
                if not isinstance(reduction, dict):
                    raise ConfigError("reduction_config must be an object")
                fields: dict[str, Any] = {
                    key: tuple(item) if isinstance(item, list) else item for key, item in reduction.items()
                }
                values["reduction_config"] = ReductionConfig(**fields)
            return cls(**values)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
        except TypeError as error:  # a field of the wrong shape that a constructor took apart
            raise ConfigError(f"{where}: {error}") from None

    # -- other sources ---------------------------------------------------------------------------
    @classmethod
    def from_hook_config(cls, document: Mapping[str, Any], *, drop_unknown_collections: bool = False) -> CaptureConfig:
        """A SageMaker DebugHookConfig document (``HookParameters``, ``CollectionConfigurations``,
        ``LocalPath``). An unknown collection is a ConfigError, or dropped with a warning when
        ``drop_unknown_collections`` (training has started: fail open)."""
        from trainguard.config.json_config import hook_kwargs_from_document

        kwargs = hook_kwargs_from_document(dict(document), drop_unknown_collections=drop_unknown_collections)
        kwargs.pop("collection_manager", None)
        kept = set(kwargs.get("include_collections") or ())
        entries = [
            entry for entry in document.get("CollectionConfigurations") or []
            if isinstance(entry, Mapping) and entry.get("CollectionName") in kept
        ]  # fmt: skip
        return cls(**kwargs, collection_configurations=tuple(entries))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, drop_unknown_collections: bool = True) -> CaptureConfig:
        """The zero-code capture's config: ``TRAINGUARD_CAPTURE`` (what ``trainguard run`` sets),
        else the variables a container sets by hand (``TRAINGUARD_OUT_DIR``, ``TRAINGUARD_CONFIG``,
        ``TRAINGUARD_SAVE_INTERVAL``, ``TRAINGUARD_OVERHEAD_BUDGET``,
        ``TRAINGUARD_OVERHEAD_MAX_INTERVAL``) over zero-code capture's defaults."""
        text = environ.get(CAPTURE_VARIABLE)
        if text:
            return cls.from_json(text)
        from trainguard.config.json_config import read_hook_config

        path = environ.get("TRAINGUARD_CONFIG")
        config = (
            cls.from_hook_config(read_hook_config(path), drop_unknown_collections=drop_unknown_collections)
            if path else cls()
        )  # fmt: skip
        changes: dict[str, Any] = {}
        if environ.get("TRAINGUARD_OUT_DIR"):
            changes["out_dir"] = environ["TRAINGUARD_OUT_DIR"]
        if config.save_config is None:
            interval = _whole(environ, "TRAINGUARD_SAVE_INTERVAL", ZERO_CODE_SAVE_INTERVAL)
            changes["save_config"] = SaveConfig(save_interval=interval)
        if config.include_collections is None:
            changes["include_collections"] = ZERO_CODE_COLLECTIONS
        raw = environ.get("TRAINGUARD_OVERHEAD_BUDGET")
        if raw:
            try:
                budget = float(raw)
            except ValueError:
                budget = -1.0
            if not 0 <= budget < 1:
                raise ConfigError(f"TRAINGUARD_OVERHEAD_BUDGET={raw!r} is not a fraction from 0 to below 1")
            changes["overhead_budget"] = budget
        if environ.get("TRAINGUARD_OVERHEAD_MAX_INTERVAL"):
            changes["overhead_max_interval"] = _whole(environ, "TRAINGUARD_OVERHEAD_MAX_INTERVAL", 0)
        try:
            return config.replace(**changes)
        except ConfigError as error:
            raise ConfigError(f"{error} (from the TRAINGUARD_* variables)") from None

    def with_zero_code_defaults(self) -> CaptureConfig:
        """Zero-code capture's schedule and collections where this config leaves them open."""
        changes: dict[str, Any] = {}
        if self.save_config is None:
            changes["save_config"] = SaveConfig(save_interval=ZERO_CODE_SAVE_INTERVAL)
        if self.include_collections is None:
            changes["include_collections"] = ZERO_CODE_COLLECTIONS
        return self.replace(**changes) if changes else self


def _whole(environ: Mapping[str, str], name: str, default: int) -> int:
    """A positive whole number from the variable ``name``; ``default`` when it is unset or empty."""
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r} is not a positive whole number")
    return value
