"""Background processes beside training (the writer process, the rule runner of ``trainguard
run``) give way to it: on a machine whose cores are all busy, training comes first."""

from __future__ import annotations

import logging
import os

__all__ = ["nice_from_environment", "yield_to_training"]

logger = logging.getLogger("trainguard")


def yield_to_training(nice: int) -> None:
    """Run the calling process as batch work at ``nice``: a message from the training process
    wakes it without preempting the sender (a normal process would, on every step's message
    when cores are few), and when cores are short, training runs first."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: normal scheduling
        pass
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass


def nice_from_environment(variable: str, default: int) -> int:
    """A nice value 0-19 from ``variable``; a bad value warns and keeps ``default`` (this is
    read inside training: it must not fail the job)."""
    raw = os.environ.get(variable, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        logger.warning("trainguard: %s=%r is not 0-19; using %d", variable, raw, default)
        return default
    return value
