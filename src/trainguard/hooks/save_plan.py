"""What to write for one tensor at one step: its raw value, which reductions, its shape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.config.collections import SCALAR_COLLECTIONS, Collection
from trainguard.config.reduction_config import ReductionConfig

__all__ = ["SavePlan", "plan_of"]


@dataclass(frozen=True)
class SavePlan:
    """What to write for one tensor at the current step."""

    save_raw: bool
    reductions: tuple[tuple[str, bool], ...]  # (reduction, absolute)
    save_shape: bool


def plan_of(due: Sequence[Collection], default_config: ReductionConfig) -> SavePlan | None:
    """The plan of a tensor that the ``due`` collections save now (None: none does). Scalar
    collections save raw values; the others as their reduction config (or the hook's) says."""
    if not due:
        return None
    save_raw = False
    save_shape = False
    reductions: list[tuple[str, bool]] = []
    for collection in due:
        if collection.name in SCALAR_COLLECTIONS:
            save_raw = True
            continue
        config = collection.reduction_config or default_config
        save_raw = save_raw or config.save_raw_tensor or not config.has_reductions
        save_shape = save_shape or config.save_shape
        reductions.extend(item for item in config.requested() if item not in reductions)
    return SavePlan(save_raw=save_raw, reductions=tuple(reductions), save_shape=save_shape)
