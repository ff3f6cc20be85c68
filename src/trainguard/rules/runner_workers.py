"""Per-worker rule instances of a rule runner, and the steps a worker wrote late.

:class:`trainguard.rules.runner.RuleRunner` has one :class:`RunnerWorkers` once the run is open.
The runner evaluates a global step once it is complete, that is once the workers a reader waits
for wrote it; under
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
import dataclasses
from collections.abc import Sequence
from typing import Any

from trainguard.rules.base import Rule, StepResult
from trainguard.rules.compat import make_rule
from trainguard.rules.progress import RuleProgress
from trainguard.rules.spec import RuleSpec

__all__ = ["RunnerWorkers", "evaluates_per_worker", "on_worker", "overrides"]


def evaluates_per_worker(rule: Rule) -> bool:
    """Whether the runner gives each worker its own instance of ``rule`` (see the module doc)."""
    declared = getattr(type(rule), "per_worker", None)
    if declared is not None:
        return bool(declared)
    return getattr(rule, "kind", "debugger") == "debugger" and not overrides(rule, "check_idle")


def overrides(rule: Rule, method: str) -> bool:
    """Whether the rule implements ``method`` itself (a profiler rule may have no ``check``)."""
    return getattr(type(rule), method) is not getattr(Rule, method)


class RunnerWorkers:
    """Worker instances and late workers' steps for :class:`~trainguard.rules.runner.RuleRunner`.

    Args:
        trial: the open run the rules read.
        specs: the rule configurations (a worker's instance is made from its spec).
        progress: the runner's state per configuration (the same dict, not a copy): the cursors
            it reads, the per-worker steps it moves.
        other_trials: passed to every instance, as to the runner's own.
        start_step, end_step: the runner's step range.

    Made before any step is evaluated: a progress file saved before ``worker_steps`` existed has
    its workers count as evaluated up to the cursor it was saved with.
    """

    def __init__(
        self,
        trial: Any,
        specs: list[RuleSpec],
        progress: dict[str, RuleProgress],
        *,
        other_trials: Sequence[Any] = (),
        start_step: int | None = None,
        end_step: int | None = None,
    ) -> None:
        self.trial = trial
        self.progress = progress
        self.other_trials = list(other_trials)
        self.start_step = start_step
        self.end_step = end_step
        self._specs = {spec.name: spec for spec in specs}
        # configuration -> its one instance (the runner's), whether it runs per worker, and then
        # worker -> that worker's instance
        self._rules: dict[str, Rule] = {}
        self._per_worker: dict[str, bool] = {}
        self.worker_rules: dict[str, dict[str, Rule]] = {}
        # configuration -> the step workers unknown to its progress file count as evaluated up to
        self._worker_floor: dict[str, int] = {
            name: state.last_evaluated_step
            for name, state in progress.items()
            if state.worker_steps is None and state.last_evaluated_step is not None
        }

    def add(self, name: str, rule: Rule, per_worker: bool) -> None:
        """``rule`` is configuration ``name``'s instance; with ``per_worker`` each worker gets its own."""
        self._rules[name] = rule
        self._per_worker[name] = per_worker
        self.worker_rules[name] = {}

    def worker_instance(self, name: str, worker: str) -> Rule:
        """``worker``'s instance of configuration ``name``, made when first asked for."""
        instances = self.worker_rules[name]
        if worker not in instances:
            from trainguard.trial.worker_view import WorkerTrial

            instances[worker] = make_rule(WorkerTrial(self.trial, worker), self._specs[name], self.other_trials)
        return instances[worker]

    def instances(self, name: str, step: int | None = None) -> list[tuple[str | None, Rule]]:
        """(worker, rule instance) pairs to evaluate: one per worker that wrote ``step`` for a
        per-worker rule (created when the worker first appears), else the one instance. Without
        a step: every worker instance so far (or the one instance if none was made)."""
        if not self._per_worker.get(name):
            return [(None, self._rules[name])]
        if step is None:
            return list(self.worker_rules[name].items()) or [(None, self._rules[name])]
        record = self.trial._state.steps.get(step)
        workers = sorted(record.workers) if record is not None else []
        return [(worker, self.worker_instance(name, worker)) for worker in workers]

    def worker_evaluated(self, name: str, worker: str | None, step: int) -> None:
        """``worker``'s instance of ``name`` evaluated ``step`` (None: the one instance, nothing kept)."""
        if worker is None:
            return
        state = self.progress[name]
        if state.worker_steps is None:
            state.worker_steps = {}
        if state.worker_steps.get(worker, -1) < step:
            state.worker_steps[worker] = step

    def late_steps(self, name: str) -> list[tuple[str, int]]:
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


def on_worker(result: StepResult | None, worker: str | None) -> StepResult | None:
    """``result`` attributed to ``worker`` unless the rule said otherwise."""
    if result is None or worker is None or result.worker is not None:
        return result
    return dataclasses.replace(result, worker=worker)
