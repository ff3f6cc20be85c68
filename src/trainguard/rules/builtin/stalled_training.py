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

Per worker (a data-parallel job, every rank writing its own steps), the same clock runs for each
worker's newest step:

    t_last(w) = when the runner first saw worker w's newest step
    fire on w if more than one worker wrote steps, now - t_last(w) > threshold, and another
             worker's newest step is newer than w's and appeared within the last threshold s

that is, a rank stopped writing while the others go on (its writer or hook died, it hangs in a
loop of its own, its uploader stopped); the finding names the worker and the last step it
wrote. When the whole job stalls instead, the job finding names the workers whose newest step
is behind the others' (the finding is on that worker when there is one): in a synchronous job
(DDP) the rank that stopped leaves its last step unwritten while the others wait for it in their
next collective, having written theirs.

``stop_training_on_fire`` and ``training_job_name_prefix`` are kept for SageMaker configs and
reported in the finding's details; stopping is done by the runner's actions (``action_json``
``stoptraining``), not by the rule. After a finding, the rule reports again only when the
stall continues for another ``threshold`` seconds.
"""

from __future__ import annotations

import dataclasses
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
        # worker -> (its newest step, when the runner first saw it, when its stall was reported)
        self._workers: dict[str, list] = {}

    def _observe(self, now: float) -> None:
        try:
            steps = self.base_trial.steps(show_incomplete_steps=True)
            newest_of_workers = _last_steps_of_workers(self.base_trial)
        except Exception:  # noqa: BLE001 - a store hiccup is not a stall; try again on the next poll
            return
        newest = steps[-1] if steps else None
        if newest is not None and (self._newest_step is None or newest > self._newest_step):
            self._newest_step = newest
            self._newest_seen_at = now
            self._reported_at = None
        for worker, step in newest_of_workers.items():
            known = self._workers.get(worker)
            if known is None or step > known[0]:
                self._workers[worker] = [step, now, None]

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
            return self._stalled_worker(now)
        if self._reported_at is not None and now - self._reported_at <= self.threshold:
            return None
        self._reported_at = now
        since = f"step {step} appeared" if self._newest_step is not None else "the rule started (no step yet)"
        behind = self._workers_behind()
        message = f"no new step for {fmt(idle)} s since {since} (threshold {fmt(self.threshold)} s)"
        if behind:
            named = ", ".join(f"{worker} (last step {last})" for worker, last in behind.items())
            message += f"; behind the other workers: {named}, the ones the others may be waiting for"
        result = self.issue(
            step,
            message,
            idle_seconds=idle,
            last_step=self._newest_step,
            workers_behind=behind,
            stop_training=self.stop_training_on_fire,
            training_job_name_prefix=self.training_job_name_prefix,
        )
        # one worker behind is the one the job waits for: the finding is on it
        return dataclasses.replace(result, worker=next(iter(behind))) if len(behind) == 1 else result

    def _workers_behind(self) -> dict[str, int]:
        """Workers whose newest step is older than the newest any worker wrote (none alone)."""
        if len(self._workers) < 2:
            return {}
        newest = max(step for step, _, _ in self._workers.values())
        return {worker: step for worker, (step, _, _) in sorted(self._workers.items()) if step < newest}

    def _stalled_worker(self, now: float) -> StepResult | None:
        """The first worker that stopped writing while another one goes on, reported once per
        threshold of its stall."""
        if len(self._workers) < 2:
            return None
        for worker, state in sorted(self._workers.items()):
            last, seen_at, reported_at = state
            idle = now - seen_at
            if idle <= self.threshold or (reported_at is not None and now - reported_at <= self.threshold):
                continue
            going = [other for other, (step, other_seen, _) in self._workers.items()
                     if other != worker and step > last and now - other_seen <= self.threshold]  # fmt: skip
            if not going:
                continue
            state[2] = now
            newest = max(self._workers[other][0] for other in going)
            result = self.issue(
                last,
                f"{worker} wrote no new step for {fmt(idle)} s since its step {last} appeared, while "
                f"{', '.join(sorted(going))} went on to step {newest} (threshold {fmt(self.threshold)} s)",
                idle_seconds=idle,
                last_step=last,
                stalled_worker=worker,
                others_newest_step=newest,
                stop_training=self.stop_training_on_fire,
                training_job_name_prefix=self.training_job_name_prefix,
            )
            return dataclasses.replace(result, worker=worker)
        return None


def _last_steps_of_workers(trial: object) -> dict[str, int]:
    """Each worker's newest step, or {} from a trial that cannot tell."""
    getter = getattr(trial, "last_steps_of_workers", None)
    return dict(getter()) if callable(getter) else {}
