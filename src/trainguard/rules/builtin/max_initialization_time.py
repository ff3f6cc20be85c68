"""MaxInitializationTime: training takes too long to reach its first step.

Formula (SageMaker's): ``t0`` = the earliest profiler data (first system sample or timeline
start). While no ``Step:ModeKeys.*`` event was seen, fire when ``now - t0 > threshold`` minutes
(checked on idle polls too, so a job stuck before its first step is reported while it hangs).
Once the first step is seen, fire when ``first step start - t0 > threshold`` minutes.

Timelines become visible when a file is closed (every 60 s by default), so a first step in the
last minute before the threshold may be seen only after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.profiler.reader import StepTiming
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, positive

__all__ = ["MaxInitializationTime"]


class MaxInitializationTime(ProfilerRule):
    """The first training step starts more than ``threshold`` minutes after the job started."""

    rule_name = "MaxInitializationTime"
    fix_hint = (
        "Shorten start-up: download or stream data instead of copying it all first, cache "
        "preprocessed datasets, load checkpoints lazily, and check for hangs (barriers, locks) "
        "before the first step."
    )
    uses_steps = True
    threshold = Param(float, 20.0, "minutes from the start to the first step", check=positive)

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.first_step: StepTiming | None = None

    def on_steps(self, steps: Sequence[StepTiming]) -> None:
        earliest = min(steps, key=lambda step: step.start)
        if self.first_step is None or earliest.start < self.first_step.start:
            self.first_step = earliest

    def idle_due(self, now: float) -> bool:
        return self.first_step is None and self.first_timestamp is not None

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        if self.first_timestamp is None:
            return None
        limit_s = self.threshold * 60.0
        if self.first_step is not None:
            waited = self.first_step.start - self.first_timestamp
            details: dict[str, Any] = {"initialization_s": round(waited, 3), "first_step_mode": self.first_step.mode}
            if waited > limit_s:
                return self.issue(
                    self.last_step,
                    f"the first step started {waited / 60:.1f} min after the job started "
                    f"(threshold {self.threshold:g} min)",
                    **details,
                )
            return self.no_issue(self.last_step, **details)
        end = now if now is not None else self.last_timestamp
        waited = (end or self.first_timestamp) - self.first_timestamp
        details = {"waiting_s": round(waited, 3), "steps_seen": 0}
        if waited > limit_s:
            return self.issue(
                self.last_step,
                f"no training step {waited / 60:.1f} min after the job started (threshold {self.threshold:g} min)",
                **details,
            )
        return self.no_issue(self.last_step, **details)
