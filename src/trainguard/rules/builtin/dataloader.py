"""Dataloader: the training loop waits for data, or the DataLoader runs too many workers.

Formula. SageMaker's condition (open code, never exported): with ``cores`` the machine's CPU
count and ``w`` the median number of parallel data-loader worker processes, flag
``w < cores · min_threshold / 100`` (too few) or ``w > cores · max_threshold / 100`` (too many).

trainguard fires on evidence rather than on the worker count alone (a loop whose batches come
from memory needs no workers; SageMaker's rule would fire on every such loop). Per process
timeline, over the TRAIN steps seen so far (the first step skipped: it includes worker start-up),
once more than ``patience`` steps were seen:

* **slow data**: ``median(data / duration) · 100 > data_threshold`` — the step spends more than
  that share of its time between the previous step's end and its forward waiting for the batch;
  the message adds SageMaker's worker verdict (too few workers → raise ``num_workers``);
* **too many workers**: ``w > cores · max_threshold / 100`` (SageMaker's condition).

**Stopping training.** A slow-data finding is *certain* (``--stop-on-issue`` and the
stoptraining action act on it) once the stall is confirmed: at least ``2 · patience`` TRAIN steps
seen and the median share above ``data_threshold`` over the whole run *and* over each of its two
latest windows of ``patience`` steps. A median ignores single slow batches (a cold cache, one
slow read), and two disjoint windows show the stall lasts; it does not tell a loop that waits for
a slow filesystem for a while and then recovers from one that never will, so the stop waits for
the second window. Too many workers is never certain: the CPUs are oversubscribed, training goes on.

Step timings come from trainguard's framework profiler (``data`` is NaN in SageMaker's own
timelines, where only the worker condition can be evaluated).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler.reader import StepTiming
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, positive

__all__ = ["Dataloader"]


class Dataloader(ProfilerRule):
    """Steps wait for their data (slow Dataset/collate, too few workers) or workers oversubscribe the CPUs."""

    rule_name = "Dataloader"
    fix_hint = (
        "Feed batches faster: raise DataLoader num_workers (about the number of CPU cores per GPU), "
        "set pin_memory=True and persistent_workers=True, move expensive decoding/augmentation "
        "out of __getitem__ (precompute or cache), and read data from local disk."
    )
    uses_system = False
    uses_steps = True
    min_threshold = Param(float, 70.0, "fewer workers than this % of the cores is too few", check=positive)
    max_threshold = Param(float, 200.0, "more workers than this % of the cores is too many", check=positive)
    patience = Param(int, 10, "TRAIN steps per process needed before deciding", check=positive)
    data_threshold = Param(
        float, 50.0, "fire when the median step waits for data over this % of its time", check=positive
    )

    stop_policy = (
        "stops training when the input stall is confirmed: the median step waits for data over "
        "data_threshold over the run and over each of its last two windows of patience steps"
    )

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self.steps: dict[tuple[str, int], list[StepTiming]] = {}

    def on_steps(self, steps: Sequence[StepTiming]) -> None:
        for step in steps:
            if step.mode == "TRAIN":
                self.steps.setdefault((step.node, step.rank), []).append(step)

    def _cores(self, key: tuple[str, int]) -> int:
        return self.cpu_counts.get(key) or os.cpu_count() or 1

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        if not self.steps:
            return None
        stats: dict[str, Any] = {}
        for (node, rank), steps in sorted(self.steps.items()):
            usable = sorted(steps, key=lambda step: step.start)[1:]
            if len(usable) <= self.patience:
                stats[f"{node}/{rank}"] = {"steps": len(usable)}
                continue
            cores = self._cores((node, rank))
            shares = np.array([s.data / s.duration for s in usable if s.duration > 0 and not math.isnan(s.data)])
            workers = [s.dataloader_workers for s in usable if s.dataloader_workers is not None]
            share = float(np.median(shares)) * 100 if shares.size else math.nan
            median_workers = float(np.median(workers)) if workers else math.nan
            low, high = cores * self.min_threshold / 100, cores * self.max_threshold / 100
            entry = {"steps": len(usable), "data_percent": round(share, 2), "median_workers": median_workers,
                     "cores": cores, "median_data_s": float(np.median([s.data for s in usable]))}  # fmt: skip
            stats[f"{node}/{rank}"] = entry
            if not math.isnan(median_workers) and median_workers > high:
                return self.issue(
                    self.last_step,
                    f"{node} rank {rank}: the DataLoader runs {median_workers:g} workers on {cores} cores "
                    f"(more than max_threshold {self.max_threshold:g}% = {high:g}); the workers compete for the CPUs",
                    fix_hint="Lower DataLoader num_workers to about the number of CPU cores per training process.",
                    stats=stats,
                )
            if share > self.data_threshold:
                advice = ""
                if not math.isnan(median_workers) and median_workers < low:
                    advice = (
                        f"; it uses {median_workers:g} workers, fewer than min_threshold "
                        f"{self.min_threshold:g}% of {cores} cores"
                    )
                confirmed = self._confirmed(usable)
                entry["confirmed"] = confirmed
                return self.issue(
                    self.last_step,
                    f"{node} rank {rank}: the median TRAIN step spends {share:.0f}% of its time waiting for data "
                    f"(data_threshold {self.data_threshold:g}%){advice}",
                    certain=confirmed,
                    stats=stats,
                )
        return self.no_issue(self.last_step, stats=stats)

    def _confirmed(self, usable: Sequence[StepTiming]) -> bool:
        """The stall holds in each of the last two disjoint windows of ``patience`` steps."""
        window = self.patience
        if len(usable) < 2 * window:
            return False
        for part in (usable[-window:], usable[-2 * window : -window]):
            shares = [s.data / s.duration for s in part if s.duration > 0 and not math.isnan(s.data)]
            if len(shares) < window or float(np.median(shares)) * 100 <= self.data_threshold:
                return False
        return True
