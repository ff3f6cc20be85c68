"""Which collection names a hook config may use without saying what they hold.

A DebugHookConfig names collections in ``include_collections`` and ``CollectionConfigurations``.
A built-in name (``weights``, ``losses``, XGBoost's ``trees`` ...) is filled by the hook; a name of
the user's own is a collection only with an ``include_regex`` saying which tensors it holds.
Anything else matches nothing: almost always a typo (``weigths``), which would silently save
nothing, so the config is refused before training (or, where training has already started, the
name is dropped with a warning).
"""

from __future__ import annotations

from collections.abc import Iterable

from trainguard.config.collections import DEFAULT_PYTORCH_COLLECTIONS
from trainguard.errors import ConfigError

__all__ = ["FRAMEWORK_COLLECTIONS", "known_collection_names", "unknown_collection_error", "unknown_collections"]

# The collections only the Keras or XGBoost hook defines (hooks/keras.py KERAS_COLLECTIONS,
# hooks/xgboost.py XGBOOST_COLLECTIONS; named here so that reading a config imports neither
# framework). A test keeps them in step.
FRAMEWORK_COLLECTIONS = frozenset(
    {"metrics", "sm_metrics", "optimizer_variables", "hyperparameters", "feature_importance", "trees"}
    | {"full_shap", "average_shap"}
)


def known_collection_names() -> list[str]:
    """Every built-in collection name, sorted."""
    return sorted(set(DEFAULT_PYTORCH_COLLECTIONS) | FRAMEWORK_COLLECTIONS)


def unknown_collections(named: Iterable[str], defined: Iterable[str] = ()) -> list[str]:
    """The names in ``named`` that are neither built in nor ``defined`` (given an include_regex)."""
    known = set(known_collection_names()) | set(defined)
    return list(dict.fromkeys(name for name in named if name not in known))


def unknown_collection_error(unknown: list[str], where: str) -> ConfigError:
    listed = ", ".join(repr(name) for name in unknown)
    return ConfigError(
        f"unknown collection(s) {listed} in {where}: known collections are {', '.join(known_collection_names())}; "
        "a collection of your own needs an include_regex in its CollectionParameters"
    )
