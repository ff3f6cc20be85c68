"""smdebug-compatible Keras 3 API: ``import trainguard.keras as tg``.

Select the Keras backend (``KERAS_BACKEND=torch`` or ``jax``) before importing this module.

>>> hook = tg.KerasHook(out_dir="/tmp/run", save_config=tg.SaveConfig(save_interval=10),
...                     include_collections=["weights", "gradients", "losses", "metrics"])
>>> model.fit(x, y, callbacks=[hook])
>>> hook.close()

Tensor names and collections: see :mod:`trainguard.hooks.keras`.
"""

from __future__ import annotations

import os

from trainguard.config.capture_config import CAPTURE_VARIABLE, CaptureConfig
from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.json_config import config_file_named, hook_kwargs_from_json
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.hooks.keras import KerasHook as _KerasHook
from trainguard.hooks.keras import keras_collections
from trainguard.modes import ModeKeys, modes

__all__ = [
    "Collection", "CollectionManager", "Hook", "KerasHook", "ModeKeys", "ReductionConfig", "SaveConfig",
    "SaveConfigMode", "get_hook", "modes",
]  # fmt: skip

_SINGLETON: list[KerasHook] = []


class KerasHook(_KerasHook):
    """The Keras hook, a ``keras.callbacks.Callback``. Arguments as smdebug's ``KerasHook``."""

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> KerasHook:
        """Build a hook from SageMaker's ``debughookconfig.json`` (or ``$SMDEBUG_CONFIG_FILE_PATH``).

        Under ``trainguard run``, where no such file is named or exists, from the run's own
        capture config, as Keras zero-code capture builds its hook (which then stands aside: the
        script passes a hook of its own)."""
        if json_file_path is None and not config_file_named() and os.environ.get(CAPTURE_VARIABLE):
            return cls(config=CaptureConfig.from_environment(os.environ))
        kwargs = hook_kwargs_from_json(json_file_path)
        kwargs["collection_manager"] = keras_collections(kwargs.get("collection_manager"))
        return cls(**kwargs)


Hook = KerasHook  # the name trainguard.pytorch uses


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = False) -> KerasHook | None:
    """The process-wide hook, created from the JSON config on first request when asked to."""
    if not _SINGLETON and create_if_not_exists:
        _SINGLETON.append(KerasHook.create_from_json_file(json_config_path))
    return _SINGLETON[0] if _SINGLETON else None
