"""Which collections a step saves: the included collections' schedules, and the overhead budget.

A mixin of :class:`~trainguard.hooks.base.BaseHook` (kept apart so that the hook's module stays
about its lifecycle); it reads the hook's ``save_config``, ``include_collections``,
``collection_manager`` and ``_budget``, and caches in ``_schedules`` and ``_groups``.

EVAL steps also save the ``losses`` collection at the first steps of every validation pass,
whatever the schedule (bounded: :mod:`trainguard.hooks.eval_passes`, an object the schedule holds),
so that the rules compare whole passes, not one batch of each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.config.collections import Collection
from trainguard.config.save_config import SaveConfig
from trainguard.hooks.eval_passes import EvalPassSaves
from trainguard.hooks.overhead_budget import LIGHT, LIGHT_COLLECTIONS, QUIET
from trainguard.modes import ModeKeys

if TYPE_CHECKING:
    from trainguard.config.collections import CollectionManager
    from trainguard.hooks.overhead_budget import OverheadBudget

__all__ = ["NOTHING_DUE", "SaveSchedule"]

TRAINING_ONLY_COLLECTIONS = frozenset({"gradients", "optimizer_variables"})
NOTHING_DUE: frozenset[str] = frozenset()


class SaveSchedule:
    save_config: SaveConfig
    include_collections: list[str]
    collection_manager: CollectionManager
    _budget: OverheadBudget | None
    _schedules: dict[str, tuple[SaveConfig, SaveConfig]]
    _groups: list[tuple[SaveConfig, tuple[str, ...]]] | None
    _groups_for: int
    step: int
    # created at the first EVAL step (or by the hook's owner, to set another bound)
    eval_pass_saves: EvalPassSaves | None = None

    def _eval_passes(self) -> EvalPassSaves:
        saves = self.eval_pass_saves
        if saves is None:
            # An EVAL schedule the user chose for itself (SaveConfig(mode_save_configs={EVAL: ...}),
            # DebugHookConfig's eval.* keys) is kept exactly: save_steps alone means those steps.
            saves = self.eval_pass_saves = EvalPassSaves(0 if self._eval_schedule_chosen() else None)
        return saves

    def _eval_schedule_chosen(self) -> bool:
        """Whether the losses' schedule has an EVAL entry of its own (not the one every mode shares)."""
        manager = self.collection_manager
        config = self._schedule_of(manager.get("losses")) if "losses" in manager else self.save_config
        return config.get_save_config(ModeKeys.EVAL) is not config.get_save_config(ModeKeys.GLOBAL)

    def _schedule_facts(self) -> dict[str, object]:
        """For the collections file's ``_meta``: how EVAL passes are saved (rules read it)."""
        return self._eval_passes().facts(self.include_collections)

    def _schedule_of(self, collection: Collection) -> SaveConfig:
        """The collection's schedule with the hook's filling its gaps; merged once, not per step."""
        if collection.save_config is None:
            return self.save_config
        cached = self._schedules.get(collection.name)
        if cached is None or cached[0] is not collection.save_config:
            cached = (collection.save_config, collection.save_config.merged_with(self.save_config))
            self._schedules[collection.name] = cached
        return cached[1]

    def _schedule_groups(self) -> list[tuple[SaveConfig, tuple[str, ...]]]:
        """The included collections grouped by schedule: most share the hook's, so deciding a
        step asks each distinct schedule once. Rebuilt when collections change."""
        groups = self._groups
        if groups is not None and self._groups_for == len(self.include_collections):
            return groups
        by_schedule: dict[int, tuple[SaveConfig, list[str]]] = {}
        for name in self.include_collections:
            schedule = self._schedule_of(self.collection_manager.get(name))
            by_schedule.setdefault(id(schedule), (schedule, []))[1].append(name)
        groups = [(schedule, tuple(names)) for schedule, names in by_schedule.values()]
        self._groups, self._groups_for = groups, len(self.include_collections)
        return groups

    def _due_collections(self, mode: ModeKeys, mode_step: int) -> frozenset[str]:
        # Called at every step: on a step that saves nothing, one schedule test per distinct
        # schedule and no allocation.
        due: set[str] | None = None
        for schedule, names in self._schedule_groups():
            if schedule.should_save_step(mode, mode_step):
                if due is None:
                    due = set()
                due.update(names)
        if mode is ModeKeys.EVAL:
            in_pass = self._eval_passes().due(self.step, mode_step, self.include_collections)
            if in_pass:
                due = set(in_pass) if due is None else due | in_pass
        if due is None:
            return NOTHING_DUE
        if mode in (ModeKeys.EVAL, ModeKeys.PREDICT):
            due.difference_update(TRAINING_ONLY_COLLECTIONS)
        elif self._budget is not None and mode is ModeKeys.TRAIN:
            kept = self._budget.keep(mode_step)
            if kept == QUIET:
                return NOTHING_DUE
            if kept == LIGHT:
                due.intersection_update(LIGHT_COLLECTIONS)
        return frozenset(due) if due else NOTHING_DUE

    def unsaved_steps_ahead(self, mode: ModeKeys, mode_step: int, limit: int = 1024) -> int:
        """How many steps of ``mode`` after ``mode_step`` are certainly saved by no collection
        (at most ``limit``): adapters skip their per-step bookkeeping for those. Valid while
        ``_groups`` is the same list (it is rebuilt whenever collections or schedules change).
        Each run of such steps begins with one step on the general path, which costs a good
        part of a small model's step: 1,024 covers the whole gap between saves at an interval
        of 1,000. What only the general path notices (a
        PyTorch profiler started in the middle of a run) waits at most that many steps.

        Under an overhead budget, configured TRAIN steps it thins to nothing count as unsaved
        too (most of them, once it thins): the budget is asked about them now, in order, up to
        the first one it keeps. Its answers cannot change before then: it only changes its mind
        when a saved step begins."""
        if mode is ModeKeys.EVAL and self._eval_passes().limit:
            return 0  # a new pass (saved from its first step) may begin at any EVAL step
        groups = self._schedule_groups()
        budget = self._budget if mode is ModeKeys.TRAIN else None
        step = mode_step
        # From one configured step to the next (not step by step: at an interval of 1,000 that
        # was 256 schedule tests each time a run of unsaved steps was counted)
        while True:
            nexts = [schedule.next_save_step(mode, step) for schedule, _ in groups]
            step = min((found for found in nexts if found is not None), default=None)  # type: ignore[assignment]
            if step is None or step - mode_step - 1 >= limit:
                return limit
            if budget is None or self._due_collections(mode, step):
                return step - mode_step - 1
