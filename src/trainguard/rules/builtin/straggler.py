"""Straggler: one rank of a synchronous data-parallel job is much slower than the others.

In synchronous data parallelism (DDP, Horovod) every rank's step lasts as long as the slowest
rank's: the others wait for it in the gradient all-reduce, inside their backward. So the step
*durations* are the same on every rank and say nothing; what differs is where the time goes.
The slow rank spends it outside the backward (loading its batch, its forward, its optimizer
step, whatever else its loop does), the others spend the same time waiting inside theirs.

Formula, on the framework profiler's per-rank step timings (``StepTiming``; ``trainguard run
--profile``), per step type (TRAIN unless ``mode``), over steps every rank of a node timed:

    own_r(s)    = duration_r(s) - backward_r(s)      time rank r spent outside the all-reduce wait
    excess_r(s) = own_r(s) - median over the other ranks of own(s)
    D(s)        = median over ranks of duration(s)

    over the last ``window`` steps timed on every rank (at least ``window`` of them):
    fire for rank r when median(excess_r) > threshold * median(D)

The finding names the node and the rank, the median excess and the step duration. With
``threshold`` 0.5 a rank that takes 3x as long as the others (its excess is 2/3 of a step) is
found, and jitter is not: medians, because on a loaded machine single steps of any rank stall.

What it cannot tell apart: a rank slow *in its backward* (a slower device's backward) adds its
extra time where the others wait, inside the backward, so its ``own`` time is not larger and
it is not found; nor is a job where every rank is equally slow. A job whose ranks do not
synchronise each step is not a synchronous job and is judged the same way, which is right for
a straggler in the data (a rank that waits for its batches) and wrong where the ranks are
meant to differ. One rank's profile alone (a single process) is *not evaluated*. A Straggler
finding never stops training (``certain`` is never set): a slow rank is a cost, not a fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainguard.profiler.reader import StepTiming
from trainguard.rules.base import StepResult
from trainguard.rules.params import Param
from trainguard.rules.profiler_base import ProfilerRule, parse_mode, positive

__all__ = ["Straggler"]


def _mode_error(value: str) -> str | None:
    try:
        parse_mode(value)
    except ValueError as error:
        return str(error)
    return None


class Straggler(ProfilerRule):
    """One rank spends far more of each step outside the all-reduce than the others: the others wait for it."""

    rule_name = "Straggler"
    fix_hint = (
        "Find what the slow rank does differently: its data loading (a slower disk or share, fewer "
        "DataLoader workers, larger or unbalanced shards), other jobs on its machine, a slower or "
        "throttled device, extra work only that rank does (logging, checkpoints, evaluation on rank 0)."
    )
    uses_system = False
    uses_steps = True
    threshold = Param(float, 0.5, "a straggler's median extra time outside the backward, as a fraction of the "
                      "median step", check=positive)  # fmt: skip
    window = Param(int, 10, "steps (timed on every rank) judged together",
                   check=lambda v: None if v >= 2 else "must be >= 2")  # fmt: skip
    mode = Param(str, "TRAIN", "the step type judged: TRAIN, EVAL or PREDICT", optional=True, check=_mode_error)

    def __init__(self, base_trial: Any, **kwargs: Any) -> None:
        super().__init__(base_trial, **kwargs)
        self._mode = parse_mode(self.mode)
        # (node, mode) -> step -> rank -> (own time, duration)
        self._steps: dict[tuple[str, str], dict[int, dict[int, tuple[float, float]]]] = {}
        self._ranks: dict[tuple[str, str], set[int]] = {}
        self._reported: set[tuple[str, str, int]] = set()

    def on_steps(self, steps: Sequence[StepTiming]) -> None:
        for step in steps:
            if self._mode is not None and step.mode != self._mode:
                continue
            backward = step.backward if np.isfinite(step.backward) else 0.0
            key = (step.node, step.mode)
            self._steps.setdefault(key, {}).setdefault(step.step, {})[step.rank] = (step.duration - backward,
                                                                                     step.duration)  # fmt: skip
            self._ranks.setdefault(key, set()).add(step.rank)

    def assess(self, now: float | None, final: bool) -> StepResult | None:
        if not self._steps:
            mode = self._mode or "any"
            return self.not_evaluated(f"no step timings of {mode} steps (trainguard run --profile)") if final else None
        stats: dict[str, Any] = {}
        evaluated = False
        for key in sorted(self._steps):
            node, mode = key
            ranks = sorted(self._ranks[key])
            if len(ranks) < 2:
                stats[f"{node}/{mode}"] = {"ranks": ranks}
                continue
            # steps every rank timed (the newest may still be missing on a rank)
            complete = sorted(step for step, by_rank in self._steps[key].items() if len(by_rank) == len(ranks))
            recent = complete[-self.window :]
            if len(recent) < self.window:
                stats[f"{node}/{mode}"] = {"ranks": ranks, "steps": len(complete)}
                continue
            evaluated = True
            own = np.array([[self._steps[key][step][rank][0] for rank in ranks] for step in recent])
            duration = np.median(np.array([[self._steps[key][step][rank][1] for rank in ranks] for step in recent]),
                                 axis=1)  # fmt: skip
            for index, rank in enumerate(ranks):
                others = np.median(np.delete(own, index, axis=1), axis=1)
                excess = own[:, index] - others
                step_s = float(np.median(duration))
                entry = {"median_excess_s": float(np.median(excess)), "median_step_s": step_s,
                         "late_steps": int(np.count_nonzero(excess > self.threshold * duration))}  # fmt: skip
                stats[f"{node}/{mode}/rank {rank}"] = entry
                if entry["median_excess_s"] > self.threshold * step_s and (node, mode, rank) not in self._reported:
                    self._reported.add((node, mode, rank))
                    return self.issue(
                        self.last_step,
                        f"rank {rank} on {node} is a straggler: over the last {len(recent)} {mode} steps it spent "
                        f"{entry['median_excess_s'] * 1000:.1f} ms (median) more outside the backward than the "
                        f"other ranks, of a {step_s * 1000:.1f} ms step: the others wait for it in the all-reduce",
                        rank=rank, node=node, worker=f"worker_{rank}", stats=stats,
                    )  # fmt: skip
        if not evaluated:
            if not final:
                return None
            if all(len(ranks) < 2 for ranks in self._ranks.values()):
                return self.not_evaluated("one rank's step timings only: a straggler is slower than other ranks")
            return self.not_evaluated(f"fewer than {self.window} steps timed on every rank")
        return self.no_issue(self.last_step, stats=stats)
