"""Per-worker rule instances of a rule runner, and the steps a worker wrote late.

A mixin of :class:`trainguard.rules.runner.RuleRunner`. The runner evaluates a global step once
it is complete, that is once the workers a reader waits for wrote it; under
``include_workers="one"`` that is worker 0 alone, while the other ranks still write their losses
and scalars, and their files may land after worker 0's (a slower writer, or an uploader that sent
them in a later round). Those steps are behind the cursor by then; without a second look a
per-worker rule never saw them, and a rank whose loss blew up could end NoIssuesFound when its
files landed just after worker 0's.
Each per-worker rule therefore keeps, per worker, the last step that worker's instance evaluated,
and evaluates the steps a worker wrote up to the cursor that it has not seen, in order.
"""

from __future__ import annotations

import bisect
from typing import Any

from trainguard.rules.base import Rule
from trainguard.rules.compat import make_rule
from trainguard.rules.progress import RuleProgress
from trainguard.rules.spec import RuleSpec

__all__ = ["RunnerWorkers"]


class RunnerWorkers:
    """Worker instances and late workers' steps for :class:`~trainguard.rules.runner.RuleRunner`."""

    # Set by RuleRunner.__init__ (declared for readers and type checkers).
    trial: Any
    specs: list[RuleSpec]
    rules: dict[str, Rule]
    worker_rules: dict[str, dict[str, Rule]]
    progress: dict[str, RuleProgress]
    other_trials: list[Any]
    start_step: int | None
    end_step: int | None
    _per_worker: dict[str, bool]
    # configuration -> the step workers unknown to its progress file count as evaluated up to
    _worker_floor: dict[str, int]

    def _worker_instance(self, name: str, worker: str) -> Rule:
        instances = self.worker_rules[name]
        if worker not in instances:
            from trainguard.trial.worker_view import WorkerTrial

            spec = next(spec for spec in self.specs if spec.name == name)
            instances[worker] = make_rule(WorkerTrial(self.trial, worker), spec, self.other_trials)
        return instances[worker]

    def _instances(self, name: str, step: int | None = None) -> list[tuple[str | None, Rule]]:
        """(worker, rule instance) pairs to evaluate: one per worker that wrote ``step`` for a
        per-worker rule (created when the worker first appears), else the one instance. Without
        a step: every worker instance so far (or the one instance if none was made)."""
        if not self._per_worker.get(name):
            return [(None, self.rules[name])]
        if step is None:
            return list(self.worker_rules[name].items()) or [(None, self.rules[name])]
        record = self.trial._state.steps.get(step)
        workers = sorted(record.workers) if record is not None else []
        return [(worker, self._worker_instance(name, worker)) for worker in workers]

    def _worker_evaluated(self, name: str, worker: str | None, step: int) -> None:
        if worker is None:
            return
        state = self.progress[name]
        if state.worker_steps is None:
            state.worker_steps = {}
        if state.worker_steps.get(worker, -1) < step:
            state.worker_steps[worker] = step

    def _late_steps(self, name: str) -> list[tuple[str, int]]:
        """(worker, step) a per-worker rule has not evaluated although its cursor passed them,
        per worker in step order."""
        state = self.progress[name]
        cursor = state.last_evaluated_step
        if cursor is None or not self._per_worker.get(name):
            return []
        if self.end_step is not None:
            cursor = min(cursor, self.end_step - 1)
        done = state.worker_steps or {}
        floor = self._worker_floor.get(name, -1)
        late: list[tuple[str, int]] = []
        for worker, steps in list(self.trial._state.steps_of_worker.items()):
            low = done.get(worker, floor)
            if self.start_step is not None:
                low = max(low, self.start_step - 1)
            if low >= cursor:
                continue
            late.extend(
                (worker, step) for step in steps[bisect.bisect_right(steps, low) : bisect.bisect_right(steps, cursor)]
            )
        return late
