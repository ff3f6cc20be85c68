"""trainguard: capture tensors while a model trains, and catch what goes wrong while it does.

Framework hooks live in their own modules (``import trainguard.pytorch as tg``) so that importing
trainguard never imports a framework. The core depends on numpy and protobuf only.
"""

from trainguard.errors import ConfigError, FormatError, StorageError, TrainguardError, TrialError
from trainguard.modes import ModeKeys, modes

__version__ = "0.1.0"

__all__ = ["ConfigError", "FormatError", "ModeKeys", "StorageError", "TrainguardError", "TrialError", "modes"]
