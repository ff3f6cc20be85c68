"""smdebug-compatible PyTorch API: ``import trainguard.pytorch as tg``.

>>> hook = tg.Hook(out_dir="/tmp/run", save_config=tg.SaveConfig(save_interval=10))
>>> hook.register_module(model)
>>> hook.register_loss(criterion)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from trainguard.config.capture_config import CAPTURE_VARIABLE, CaptureConfig
from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.json_config import config_file_named, hook_kwargs_from_json
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode
from trainguard.hooks.pytorch import TorchHook
from trainguard.modes import ModeKeys, modes

__all__ = [
    "Collection", "CollectionManager", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "get_hook", "modes",
]  # fmt: skip

_SINGLETON: list[Hook] = []


class Hook(TorchHook):
    """The PyTorch hook. Arguments as smdebug's ``smdebug.pytorch.Hook``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        zero_code = sys.modules.get("trainguard.zero_code")  # armed only where it was imported
        if zero_code is not None:
            zero_code.yield_to_scripts_hook(self)

    @classmethod
    def create_from_json_file(cls, json_file_path: str | None = None) -> Hook:
        """Build a hook from SageMaker's ``debughookconfig.json`` (or ``$SMDEBUG_CONFIG_FILE_PATH``).

        Under ``trainguard run``, where no such file is named or exists, from the run's own
        capture config (``TRAINGUARD_CAPTURE``: its ``--out``, schedule and the rules'
        collections), so that an smdebug script runs there unchanged; zero-code capture then
        stands aside for it."""
        if json_file_path is None and not config_file_named() and os.environ.get(CAPTURE_VARIABLE):
            return cls(config=CaptureConfig.from_environment(os.environ).with_zero_code_defaults())
        return cls(**hook_kwargs_from_json(json_file_path))


def get_hook(json_config_path: str | None = None, create_if_not_exists: bool = False) -> Hook | None:
    """The process-wide hook, created from the JSON config on first request when asked to."""
    if not _SINGLETON and create_if_not_exists:
        _SINGLETON.append(Hook.create_from_json_file(json_config_path))
    return _SINGLETON[0] if _SINGLETON else None
