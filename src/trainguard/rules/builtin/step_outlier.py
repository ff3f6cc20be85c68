"""StepOutlier: too many steps take far longer than the typical step.

Formula (SageMaker's), per process timeline (host and rank) and step type (``Step:ModeKeys.TRAIN``,
``EVAL``, ...; only ``mode`` when given), once more than 100 steps were seen: with ``d`` the step
durations so far, fire when ``count(d > mean(d) + stddev · std(d)) > n_outliers`` (population
standard deviation). Step durations come from the framework profiler (``StepTiming.duration``).

A run whose every timeline holds 100 steps or fewer is *not evaluated* ("N steps, needs more
than 100"), never NoIssuesFound: too few steps for a mean and a spread says nothing about
outliers. While training runs such a timeline gives no result yet; the verdict comes at the end.
A StepOutlier finding never stops training (``certain`` is never set): slow steps are a cost,
and a few of them (checkpoints, evaluation) are part of healthy training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler.reader import StepTiming
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, SeriesStore, parse_mode, positive

__all__ = ["MIN_STEPS", "StepOutlier"]

MIN_STEPS = 100  # SageMaker's fixed minimum number of steps


class StepOutlier(ProfilerRule):
    """More than ``n_outliers`` steps are slower than ``mean + stddev·std`` of the step times."""

    rule_name = "StepOutlier"
    fix_hint = (
        "Find what the slow steps do differently (checkpointing, evaluation, logging, garbage "
        "collection, a slow batch from storage, other jobs on the machine); the profiler timeline "
        "shows whether the time goes to data, forward, backward or the optimizer."
    )
    uses_system = False
    uses_steps = True
    stddev = Param(
        float, 3.0, "a step slower than mean + stddev·std is an outlier", check=positive, documented_default=5.0
    )
    mode = Param(str, None, "only this step type: TRAIN, EVAL or PREDICT (default: every type)", optional=True)
    n_outliers = Param(
        int, 10, "fire when more steps than this are outliers", check=lambda v: None if v >= 0 else "must be >= 0"
    )

    def validate(self) -> None:
        from trainguard.errors import ConfigError

        try:
            self._mode = parse_mode(self.mode)
        except ValueError as error:
            raise ConfigError(f"{self.name()}: parameter mode: {error}") from None

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.durations = SeriesStore()

    def on_steps(self, steps: Sequence[StepTiming]) -> None:
        grouped: dict[tuple[str, int, str], list[float]] = {}
        for step in steps:
            if self._mode is None or step.mode == self._mode:
                grouped.setdefault((step.node, step.rank, step.mode), []).append(step.duration)
        for key, values in grouped.items():
            self.durations.extend(key, values)

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        keys = self.durations.keys()
        if not keys:
            return None
        stats: dict[str, Any] = {}
        finding = None
        evaluated = False
        for node, rank, mode in keys:
            durations = self.durations.get((node, rank, mode))
            if len(durations) <= MIN_STEPS:
                stats[f"{node}/{rank}/{mode}"] = {"steps": int(len(durations))}
                continue
            evaluated = True
            mean, std = float(np.mean(durations)), float(np.std(durations))
            limit = mean + self.stddev * std
            outliers = int(np.count_nonzero(durations > limit))
            stats[f"{node}/{rank}/{mode}"] = {
                "steps": int(len(durations)), "mean_s": mean, "std_s": std, "limit_s": limit, "outliers": outliers,
                "max_s": float(np.max(durations)),
            }  # fmt: skip
            if outliers > self.n_outliers and finding is None:
                finding = (node, rank, mode, outliers, len(durations), mean, limit)
        if not evaluated:
            if not final:
                return None
            most = max(entry["steps"] for entry in stats.values())
            return self.not_evaluated(f"{most} steps, needs more than {MIN_STEPS}", self.last_step)
        if finding:
            node, rank, mode, outliers, count, mean, limit = finding
            return self.issue(
                self.last_step,
                f"{outliers} of {count} {mode} steps on {node} rank {rank} took longer than {limit * 1000:.1f} ms "
                f"(mean {mean * 1000:.1f} ms + {self.stddev:g} std); n_outliers {self.n_outliers}",
                stats=stats,
            )
        return self.no_issue(self.last_step, stats=stats)
