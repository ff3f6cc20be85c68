"""Collections: named groups of tensors with their own schedule and reductions.

A tensor belongs to a collection when its name is listed in ``tensor_names`` or any
``include_regex`` is found in it (``re.search``, as smdebug). The collections file written
with every run is smdebug's ``collections.json``, so smdebug readers see the same groups.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.errors import ConfigError
from trainguard.modes import ModeKeys

__all__ = ["Collection", "CollectionManager", "DEFAULT_PYTORCH_COLLECTIONS", "SCALAR_COLLECTIONS"]

# smdebug's default regexes for PyTorch tensor names, so files and rules stay interchangeable.
DEFAULT_PYTORCH_COLLECTIONS: dict[str, list[str]] = {
    "weights": [r"^(?!gradient).*weight"],
    "biases": [r"^(?!gradient).*bias"],
    "gradients": [r"^gradient"],
    "losses": [r"[Ll]oss_(?!input).*output"],
    "inputs": [r"_input_\d+$"],
    "outputs": [r"_output_\d+$"],
    "scalars": [r"^scalar/"],
    # Filled by module type (nn.ReLU, nn.Tanh, nn.Sigmoid, loss modules) as the hook meets them;
    # the regexes are SageMaker's, for runs whose tensor names carry the activation's name.
    "relu_input": [r"relu_input"],
    "relu_output": [r"relu_output"],
    "tanh_input": [r"tanh_input"],
    "tanh_output": [r"tanh_output"],
    "sigmoid_input": [r"sigmoid_input"],
    "sigmoid_output": [r"sigmoid_output"],
    # What the model is fed: a root module's inputs and integer inputs anywhere (token ids), by
    # membership (the data rules read these; "inputs" is every layer's input, mostly activations).
    "model_inputs": [],
    "predictions": [],
    "labels": [],
    # Per-rank fingerprints of the parameters and gradients (hooks/torch_fingerprint.py), which
    # ReplicaDivergence compares across ranks
    "replica_fingerprints": [r"^replica_fingerprint/"],
    "all": [],
    "default": [],
}
# Scalars are always saved raw: reducing a single number is meaningless.
SCALAR_COLLECTIONS = frozenset({"losses", "metrics", "scalars", "sm_metrics", "feature_importance", "average_shap"})


def compile_regex(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ConfigError(f"invalid regex {pattern!r} in {where}: {error}") from None


@dataclass
class Collection:
    name: str
    include_regex: list[str] = field(default_factory=list)
    tensor_names: set[str] = field(default_factory=set)
    reduction_config: ReductionConfig | None = None
    save_config: SaveConfig | None = None
    save_histogram: bool = True

    def __post_init__(self) -> None:
        self._compiled = [compile_regex(pattern, f"collection {self.name!r}") for pattern in self.include_regex]

    def include(self, patterns: str | Iterable[str]) -> None:
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            self._compiled.append(compile_regex(pattern, f"collection {self.name!r}"))
            self.include_regex.append(pattern)

    def add_tensor_name(self, name: str) -> None:
        self.tensor_names.add(name)

    def matches(self, tensor_name: str) -> bool:
        return tensor_name in self.tensor_names or any(regex.search(tensor_name) for regex in self._compiled)

    def to_json(self) -> dict[str, Any]:
        save_config = self.save_config.to_json() if self.save_config else None
        return {
            "name": self.name,
            "include_regex": list(self.include_regex),
            "tensor_names": sorted(self.tensor_names),
            "reduction_config": self.reduction_config.to_json() if self.reduction_config else None,
            "save_config": save_config,
            "save_histogram": self.save_histogram,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Collection:
        reduction = document.get("reduction_config")
        save = document.get("save_config")
        mode_configs = None
        if isinstance(save, dict):
            mode_configs = {
                mode: SaveConfigMode(
                    save_interval=config.get("save_interval") or None,
                    start_step=config.get("start_step") or 0,
                    end_step=config.get("end_step"),
                    save_steps=tuple(config.get("save_steps") or ()),
                )
                for mode, config in save.items()
                if config
            }
        reduction_config = None
        if isinstance(reduction, dict):
            reduction_config = ReductionConfig.from_tokens(
                reduction.get("reductions") or "",
                save_raw_tensor=bool(reduction.get("save_raw_tensor", False)),
                save_shape=bool(reduction.get("save_shape", False)),
            )
        return cls(
            name=document["name"],
            include_regex=list(document.get("include_regex") or []),
            tensor_names=set(document.get("tensor_names") or []),
            reduction_config=reduction_config,
            save_config=SaveConfig(mode_configs) if mode_configs else None,
            save_histogram=bool(document.get("save_histogram", True)),
        )


class CollectionManager:
    """All collections of one hook or one run, and the collections file."""

    def __init__(self, collections: Iterable[Collection] = ()) -> None:
        self._collections: dict[str, Collection] = {}
        for collection in collections:
            self._collections[collection.name] = collection

    @classmethod
    def pytorch_defaults(cls) -> CollectionManager:
        return cls(Collection(name, list(patterns)) for name, patterns in DEFAULT_PYTORCH_COLLECTIONS.items())

    def get(self, name: str, create: bool = True) -> Collection:
        if name not in self._collections:
            if not create:
                raise KeyError(name)
            self._collections[name] = Collection(name)
        return self._collections[name]

    def __contains__(self, name: str) -> bool:
        return name in self._collections

    def __iter__(self) -> Iterator[Collection]:
        return iter(self._collections.values())

    def names(self) -> list[str]:
        return list(self._collections)

    def render(self, num_workers: int, framework: str | None = None, extra: dict[str, object] | None = None) -> bytes:
        """The collections file; ``framework`` ("pytorch", "keras", "xgboost") and ``extra`` facts
        about the run go in ``_meta`` (an extra key smdebug ignores): rules give framework-specific
        fix hints and read how the run trains (see :meth:`meta_of`)."""
        meta: dict[str, object] = {"num_workers": num_workers}
        if framework:
            meta["framework"] = framework
        meta.update(extra or {})
        document = {
            "collections": {name: collection.to_json() for name, collection in self._collections.items()},
            "_meta": meta,
        }
        return json.dumps(document).encode("utf-8")

    @staticmethod
    def meta_of(data: bytes) -> dict[str, object]:
        """The ``_meta`` facts of a collections file ({} for smdebug's files)."""
        try:
            meta = json.loads(data).get("_meta", {})
        except (ValueError, AttributeError):
            return {}
        return meta if isinstance(meta, dict) else {}

    @staticmethod
    def framework_of(data: bytes) -> str | None:
        """The framework a collections file names (files written by smdebug name none)."""
        try:
            value = json.loads(data).get("_meta", {}).get("framework")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, str) and value else None

    @classmethod
    def parse(cls, data: bytes) -> tuple[CollectionManager, int]:
        """Parse a collections file; returns the manager and the run's number of workers."""
        document = json.loads(data)
        manager = cls(Collection.from_json(item) for item in document.get("collections", {}).values())
        return manager, int(document.get("_meta", {}).get("num_workers", 1))


def modes_saving_gradients() -> tuple[ModeKeys, ...]:
    """Gradients exist only while training (as in smdebug, never saved in EVAL/PREDICT)."""
    return (ModeKeys.TRAIN, ModeKeys.GLOBAL)
