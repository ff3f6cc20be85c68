"""StalledTrainingRule: no new step was written for ``threshold`` seconds (wall clock).

Formula, evaluated by :meth:`check_idle` on every poll of the rule runner (``now`` = the
runner's ``time.time()``):

    t_last = the runner's clock when it first saw the newest step (or when the rule started,
             before any step appeared)
    fire if training has not ended and now - t_last > threshold

"When a step appeared" is measured with the rule runner's own clock, not with the stores'
modification times: trainguard's stores (local disk, S3, memory) do not share an mtime API,
and the runner's clock is one clock for every store, with no skew between the training host
and the runner. The cost: a runner started late sees old steps as new (the stall clock
starts when the runner starts), and detection is as late as the poll interval.

``stop_training_on_fire`` and ``training_job_name_prefix`` are kept for SageMaker configs and
reported in the finding's details; stopping is done by the runner's actions (``action_json``
``stoptraining``), not by the rule. After a finding, the rule reports again only when the
stall continues for another ``threshold`` seconds.
"""

from __future__ import annotations

import time

from trainguard.rules.base import Rule, StepResult
from trainguard.rules.builtin._losses import fmt
from trainguard.rules.params import Param


class StalledTrainingRule(Rule):
    """Training stopped writing steps: hung data loading, a deadlock, or a dead worker."""

    rule_name = "StalledTrainingRule"
    collections = ()
    fix_hint = (
        "find where the job hangs (py-spy dump --pid <pid>): a stuck data-loading worker, a collective "
        "waiting for a dead rank, or I/O on a slow file system; make sure the hook saves a step more often "
        "than threshold seconds"
    )
    fix_hints = {
        "pytorch": (
            "find where the job hangs (py-spy dump --pid <pid>): a stuck DataLoader worker (try num_workers=0), "
            "a collective waiting for a dead rank (set a NCCL/gloo timeout), or I/O on a slow file system; "
            "make sure the hook saves a step more often than threshold seconds"
        ),
    }

    threshold = Param(float, 1800.0, "seconds without a new step before firing",
                      check=lambda value: None if value > 0 else "must be > 0")
    stop_training_on_fire = Param(bool, False, "stop the training job when the rule fires (via the runner's actions)")
    training_job_name_prefix = Param(str, None, "job name prefix of the job to stop (SageMaker)", optional=True)

    def validate(self) -> None:
        self._started = time.time()
        self._newest_step: int | None = None
        self._newest_seen_at = self._started
        self._reported_at: float | None = None

    def _observe(self, now: float) -> None:
        try:
            steps = self.base_trial.steps(show_incomplete_steps=True)
        except Exception:  # noqa: BLE001 - a store hiccup is not a stall; try again on the next poll
            return
        newest = steps[-1] if steps else None
        if newest is not None and (self._newest_step is None or newest > self._newest_step):
            self._newest_step = newest
            self._newest_seen_at = now
            self._reported_at = None

    def check(self, step: int) -> StepResult | None:
        self._observe(time.time())
        return None  # a step arriving is progress; stalls are judged in check_idle

    def check_idle(self, now: float) -> StepResult | None:
        self._observe(now)
        if self.base_trial.training_ended:
            return None
        idle = now - self._newest_seen_at
        step = self._newest_step if self._newest_step is not None else -1
        if idle <= self.threshold:
            return None
        if self._reported_at is not None and now - self._reported_at <= self.threshold:
            return None
        self._reported_at = now
        since = f"step {step} appeared" if self._newest_step is not None else "the rule started (no step yet)"
        return self.issue(
            step,
            f"no new step for {fmt(idle)} s since {since} (threshold {fmt(self.threshold)} s)",
            idle_seconds=idle,
            last_step=self._newest_step,
            stop_training=self.stop_training_on_fire,
            training_job_name_prefix=self.training_job_name_prefix,
        )
