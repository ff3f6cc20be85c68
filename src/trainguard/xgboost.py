"""smdebug-compatible XGBoost API: ``import trainguard.xgboost as tg``.

>>> hook = tg.Hook(out_dir="/tmp/run", train_data=dtrain, validation_data=dval,
...                hyperparameters=params, save_config=tg.SaveConfig(save_interval=5))
>>> booster = xgboost.train(params, dtrain, num_boost_round=100, evals=[(dtrain, "train"), (dval, "validation")],
...                         callbacks=[hook])
"""

from __future__ import annotations

from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.hooks.json_config import hook_kwargs_from_json
from trainguard.hooks.xgboost import XGBoostHook
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
        """Build a hook from SageMaker's ``debughookconfig.json``; ``kwargs`` add the data sets."""
        return cls(**hook_kwargs_from_json(json_file_path), **kwargs)  # type: ignore[arg-type]
