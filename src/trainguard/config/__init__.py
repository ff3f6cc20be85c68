"""Hook configuration: schedules, reductions, collections, and smdebug's JSON config."""

from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig, SaveConfigMode

__all__ = ["Collection", "CollectionManager", "ReductionConfig", "SaveConfig", "SaveConfigMode"]
