"""smdebug-compatible XGBoost API: ``import trainguard.xgboost as tg``.

>>> hook = tg.Hook(out_dir="/tmp/run", train_data=dtrain, validation_data=dval,
...                hyperparameters=params, save_config=tg.SaveConfig(save_interval=5))
>>> booster = xgboost.train(params, dtrain, num_boost_round=100, evals=[(dtrain, "train"), (dval, "validation")],
...                         callbacks=[hook])
"""

from __future__ import annotations

from typing import Any

from trainguard.config.collections import DEFAULT_PYTORCH_COLLECTIONS, Collection, CollectionManager
from trainguard.config.json_config import hook_kwargs_from_json
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.hooks.base import BaseHook
from trainguard.hooks.xgboost import XGBoostHook, xgboost_collections
from trainguard.modes import ModeKeys, modes

__all__ = [
    "Collection", "CollectionManager", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "modes",
]


class Hook(XGBoostHook):
    """The XGBoost hook (a ``xgboost.callback.TrainingCallback``). Arguments as smdebug's
    ``smdebug.xgboost.Hook``: ``out_dir``, ``save_config``, ``include_collections``,
    ``include_regex``, ``hyperparameters``, ``train_data``, ``validation_data``..."""

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None, **kwargs: object) -> Hook:
        """Build a hook from SageMaker's ``debughookconfig.json`` (or ``$SMDEBUG_CONFIG_FILE_PATH``);
        ``kwargs`` add what a JSON file cannot hold (``train_data``, ``validation_data``,
        ``hyperparameters``)."""
        return cls(**_xgboost_kwargs(hook_kwargs_from_json(json_file_path)), **kwargs)  # type: ignore[arg-type]


def _xgboost_kwargs(parsed: dict[str, Any]) -> dict[str, Any]:
    """The JSON reader's keyword arguments, with XGBoost's collections instead of PyTorch's.

    The reader configures PyTorch's default collections; the configured ones (schedules, extra
    regexes) are carried over onto XGBoost's, and PyTorch's default selection is replaced by
    XGBoost's (an explicit ``include_collections`` is kept as given).
    """
    kwargs = dict(parsed)
    parsed_manager = kwargs.pop("collection_manager", None)
    manager = xgboost_collections()
    include = list(kwargs.get("include_collections") or [])
    pytorch_defaults = list(BaseHook.default_collections)
    if include[: len(pytorch_defaults)] == pytorch_defaults:
        include = list(XGBoostHook.default_collections) + include[len(pytorch_defaults) :]
        kwargs["include_collections"] = list(dict.fromkeys(include))
    if parsed_manager is not None:
        for collection in parsed_manager:
            configured = collection.save_config is not None or collection.name in include
            if not configured:
                continue
            target = manager.get(collection.name)
            pytorch_regexes = DEFAULT_PYTORCH_COLLECTIONS.get(collection.name, [])
            extra = [r for r in collection.include_regex if r not in pytorch_regexes and r not in target.include_regex]
            if extra:
                target.include(extra)
            if collection.save_config is not None:
                target.save_config = collection.save_config
    kwargs["collection_manager"] = manager
    return kwargs
