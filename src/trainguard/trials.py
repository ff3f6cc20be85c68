"""smdebug's import path: ``from trainguard.trials import create_trial``."""

from trainguard.trial import StepState, Tensor, Trial, create_trial

__all__ = ["StepState", "Tensor", "Trial", "create_trial"]
