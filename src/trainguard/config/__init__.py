"""Hook configuration: the capture config every hook takes, schedules, reductions, collections,
and smdebug's JSON config."""

from trainguard.config.capture_config import CaptureConfig
from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode

__all__ = ["CaptureConfig", "Collection", "CollectionManager", "ReductionConfig", "SaveConfig", "SaveConfigMode"]
