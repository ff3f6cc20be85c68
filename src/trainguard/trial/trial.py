"""Reading a run, finished or live: smdebug's trial API, plus batched reads and a timeout on
every wait."""

from __future__ import annotations

import bisect
import enum
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trainguard.config.collections import Collection, CollectionManager
from trainguard.errors import (
    FormatError,
    InvalidWorker,
    MissingCollectionFiles,
    NoMoreData,
    StepNotYetAvailable,
    StepUnavailable,
    StorageError,
    TensorUnavailable,
    TensorUnavailableForStep,
    TrialError,
    WaitTimeout,
)
from trainguard.modes import ModeKeys
from trainguard.storage.base import Store
from trainguard.storage.capture_status import status_dir_from_environment
from trainguard.trial.collections_file import load_collections
from trainguard.trial.event_reads import EventReads
from trainguard.trial.records import decode_record
from trainguard.trial.run_health import RunHealth
from trainguard.trial.state import REDUCTION_PREFIX as _REDUCTION_PREFIX
from trainguard.trial.state import Damage, Location, RunState
from trainguard.trial.tensor import Tensor

__all__ = ["Damage", "StepState", "Trial"]


class StepState(enum.Enum):
    UNAVAILABLE = 0
    AVAILABLE = 1
    NOT_YET_AVAILABLE = 2


class Trial(RunHealth):
    """A run's tensors by name, step, mode and worker. Create with :func:`create_trial`.

    What is wrong with the run (damaged files, a capture that stopped early) comes from
    :class:`~trainguard.trial.run_health.RunHealth`."""

    def __init__(
        self,
        store: Store,
        *,
        name: str | None = None,
        collection_wait_timeout: float = 60.0,
        refresh_interval: float = 0.0,
        missing_event_wait: float = 10.0,
        parallel_reads: int = 1,
    ) -> None:
        self.store = store
        self.path = store.url
        self.name = name or store.url.rstrip("/").rsplit("/", 1)[-1]
        self._refresh_interval = refresh_interval
        self._last_refresh = 0.0
        self._framework: str | None = None
        self._independent_optimizers = 1
        self._model_scopes: dict[str, list[str]] = {}
        self._checksums_declared = False
        self._capture_status_dir = status_dir_from_environment()
        self._collections, num_workers = self._load_collections(collection_wait_timeout)
        self._collections_final = False
        self._state = RunState(
            store, num_workers, parallel_reads=parallel_reads, checksums_required=self._checksums_declared
        )
        self._selections: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self._selection_version: tuple[Any, ...] | None = None
        # Answers rules ask for at every step, kept until what they depend on changes (steps are
        # only ever added, so counts and the last complete step are versions): per-step rule
        # evaluation then costs the same on step 20,000 as on step 10.
        self._steps_cache: dict[tuple[Any, ...], tuple[Any, list[int]]] = {}
        self._tensor_steps_cache: dict[tuple[Any, ...], tuple[Any, list[int]]] = {}
        self._modes_cache: tuple[int, list[ModeKeys]] = (-1, [])
        # event files named by an index that were still absent after the wait: waited for once
        self._missing_event_files: set[str] = set()
        self._event_reads = EventReads(store, self.path, missing_event_wait, self._missing_event_files)
        # event file -> what was wrong with a record read from it (corrupt, checksum refused)
        self._damaged_records: dict[str, str] = {}
        self.refresh(force=True)

    def __repr__(self) -> str:
        return f"Trial({self.path!r}, steps={len(self._state.steps)}, ended={self._state.training_ended})"

    # -- loading ------------------------------------------------------------------------------
    def _load_collections(self, timeout: float) -> tuple[CollectionManager, int]:
        run = load_collections(self.store, timeout)
        self._framework = self._framework or run.framework
        self._independent_optimizers = max(self._independent_optimizers, run.independent_optimizers)
        self._model_scopes.update(run.model_scopes)
        # once declared, never taken back: a rewritten file must not lift the check
        self._checksums_declared = self._checksums_declared or run.checksums_declared
        return run.manager, run.num_workers

    def refresh(self, force: bool = False) -> None:
        if self._state.loaded_all_steps:
            return
        now = time.monotonic()
        if force or now - self._last_refresh >= self._refresh_interval:
            self._last_refresh = now
            if self._state.refresh():
                # Hooks rewrite the collections file, before a step's index, when tensors join a
                # collection mid-run (activations found by module type); rules select by it.
                self._reload_collections()
            elif self._state.training_ended and not self._collections_final:
                self._reload_collections()
                self._collections_final = True

    def _reload_collections(self) -> None:
        try:
            self._collections, _ = self._load_collections(0.0)
        except (MissingCollectionFiles, StorageError):
            pass  # keep the ones we have; the next refresh tries again
        if self._checksums_declared:
            self._state.checksums_required = True

    def maybe_refresh(self) -> None:
        self.refresh()

    # -- run-level facts ----------------------------------------------------------------------
    @property
    def loaded_all_steps(self) -> bool:
        self.refresh()
        return self._state.loaded_all_steps

    @property
    def training_ended(self) -> bool:
        self.refresh()
        return self._state.training_ended

    @property
    def framework(self) -> str | None:
        """The framework that wrote the run ("pytorch", "keras", "xgboost"), or None when it does
        not say (smdebug's files): rules pick their fix hints by it."""
        if self._framework is None and any(name.startswith("trees/") for name in self._state.tensors):
            return "xgboost"  # XGBoost runs are the ones that dump trees, whoever wrote them
        return self._framework

    @property
    def num_workers(self) -> int:
        return self._state.num_workers

    @property
    def independent_optimizers(self) -> int:
        """How many optimizers stepped disjoint sets of parameters (as far as the hook saw; 1 when
        the run does not say): 2 or more is a GAN, an actor-critic, models trained against each
        other, whose losses need not fall."""
        self.refresh()
        return self._independent_optimizers

    @property
    def model_scopes(self) -> dict[str, list[str]]:
        """Root model -> the first name components of its module tensors, when the run trained
        several models ({} otherwise; see trainguard.hooks.torch_model_scopes)."""
        self.refresh()
        return dict(self._model_scopes)

    @property
    def last_complete_step(self) -> int | None:
        self.refresh()
        return self._state.last_complete_step()

    def workers(self) -> list[str]:
        self.refresh()
        return sorted(self._state.workers)

    def last_steps_of_workers(self) -> dict[str, int]:
        """Each worker's newest written step, complete or not (``{"worker_0": 41, ...}``)."""
        self.refresh()
        return {worker: steps[-1] for worker, steps in self._state.steps_of_worker.items() if steps}

    def modes(self) -> list[ModeKeys]:
        self.refresh()
        count, modes = self._modes_cache
        if count != len(self._state.steps):
            present: set[ModeKeys] = {
                mode for mode, names in self._state.by_mode.items() if names and mode != ModeKeys.GLOBAL
            }
            if any(record.mode == ModeKeys.GLOBAL for record in self._state.steps.values()):
                present.add(ModeKeys.GLOBAL)
            modes = sorted(present, key=lambda mode: mode.value)
            self._modes_cache = (len(self._state.steps), modes)
        return list(modes)

    def steps(self, mode: ModeKeys = ModeKeys.GLOBAL, show_incomplete_steps: bool = False) -> list[int]:
        """Global steps (mode GLOBAL) or the mode's own step numbers."""
        self.refresh()
        return list(self._cached_steps(ModeKeys.parse(mode), show_incomplete_steps))

    def _cached_steps(self, mode: ModeKeys, show_incomplete_steps: bool) -> list[int]:
        """``steps()``'s answer, shared: callers must not change it."""
        state = self._state
        steps_of_mode = state.by_mode[mode]
        version = (len(steps_of_mode), None if show_incomplete_steps else state.last_complete_step())
        key = (mode, show_incomplete_steps)
        cached = self._steps_cache.get(key)
        if cached is None or cached[0] != version:
            steps = sorted(
                mode_step
                for mode_step, step in steps_of_mode.items()
                if show_incomplete_steps or state.is_complete(step)
            )
            cached = self._steps_cache[key] = (version, steps)
        return cached[1]

    def mode(self, global_step: int) -> ModeKeys:
        return self._record(global_step).mode

    def mode_step(self, global_step: int) -> int:
        return self._record(global_step).mode_step

    def global_step(self, mode: ModeKeys, mode_step: int) -> int:
        return self._global(mode_step, ModeKeys.parse(mode))

    def collections(self) -> dict[str, Collection]:
        return {collection.name: collection for collection in self._collections}

    def collection(self, name: str) -> Collection:
        if name not in self._collections:
            raise TrialError(f"no collection {name!r} in {self.path}; it has: {', '.join(self._collections.names())}")
        return self._collections.get(name)

    # -- tensors ------------------------------------------------------------------------------
    def tensor_names(
        self,
        show_prefixed_tensors: bool = False,
        *,
        step: int | None = None,
        mode: ModeKeys = ModeKeys.GLOBAL,
        regex: str | Sequence[str] | None = None,
        collection: str | Collection | None = None,
    ) -> list[str]:
        self.refresh()
        state = self._state
        cache_key = None
        if step is None and mode == ModeKeys.GLOBAL and (collection is None or isinstance(collection, str)):
            # Rules ask for the same selections at every step: keep them until a tensor name or
            # the collections change (names are only ever added, so their count is a version).
            version = (len(state.tensors), len(state.reductions_of), self._collections)
            if self._selection_version != version:
                self._selections, self._selection_version = {}, version
            regex_key = regex if regex is None or isinstance(regex, str) else tuple(regex)
            cache_key = (show_prefixed_tensors, regex_key, collection)
            if cache_key in self._selections:
                return list(self._selections[cache_key])
        names: Iterable[str] = set(state.tensors) | set(state.reductions_of)
        if not show_prefixed_tensors:
            names = [name for name in names if not name.startswith(_REDUCTION_PREFIX)]
        if step is not None:
            global_step = self._global(step, ModeKeys.parse(mode))
            names = [name for name in names if self._saved_at(name, global_step)]
        elif mode != ModeKeys.GLOBAL:
            of_mode = state.names_by_mode[ModeKeys.parse(mode)]
            names = [name for name in names if name in of_mode]
        if regex is not None:
            patterns = [re.compile(pattern) for pattern in ([regex] if isinstance(regex, str) else regex)]
            names = [name for name in names if any(pattern.search(name) for pattern in patterns)]
        if collection is not None:
            group = self.collection(collection) if isinstance(collection, str) else collection
            names = [name for name in names if group.matches(name)]
        selected = sorted(names)
        if cache_key is not None:
            self._selections[cache_key] = tuple(selected)
        return selected

    def has_tensor(self, name: str) -> bool:
        self.refresh()
        return name in self._state.tensors or name in self._state.reductions_of

    def _saved_at(self, name: str, global_step: int) -> bool:
        """Whether the raw tensor or one of its reductions was saved at ``global_step`` (O(1))."""
        tensors = self._state.tensors
        if global_step in tensors.get(name, ()):
            return True
        return any(global_step in tensors[reduction] for reduction in self._state.reductions_of.get(name, ()))

    def _saved_steps(self, name: str) -> set[int]:
        """Global steps with the raw tensor or any of its reductions."""
        steps = set(self._state.tensors.get(name, ()))
        for reduction in self._state.reductions_of.get(name, ()):
            steps.update(self._state.tensors[reduction])
        return steps

    def tensor(self, name: str) -> Tensor:
        if not self.has_tensor(name):
            close = [candidate for candidate in self._state.tensors if name.lower() in candidate.lower()][:5]
            hint = f"; similar names: {close}" if close else ""
            raise TensorUnavailable(
                f"tensor {name!r} was not saved in {self.path} (so far){hint}. "
                "Include a collection that matches it in the hook's include_collections or include_regex"
            )
        return Tensor(name, self)

    def tensor_values(
        self, names: Sequence[str], step: int, mode: ModeKeys = ModeKeys.GLOBAL, worker: str | None = None
    ) -> dict[str, np.ndarray]:
        """Many tensors of one step in one call: one read per event file, not one per tensor."""
        return self._read_values(list(names), step, mode, worker)

    # -- waiting ------------------------------------------------------------------------------
    def has_passed_step(self, step: int, mode: ModeKeys = ModeKeys.GLOBAL) -> StepState:
        self.refresh()
        mode = ModeKeys.parse(mode)
        global_step = self._state.by_mode[mode].get(step)
        if global_step is not None and self._state.is_complete(global_step):
            return StepState.AVAILABLE
        if self._state.training_ended:
            return StepState.UNAVAILABLE
        ordered = self._cached_steps(mode, True)
        position = bisect.bisect_right(ordered, step)
        last = self._state.last_complete_step()
        if position < len(ordered) and last is not None and self._state.by_mode[mode][ordered[position]] <= last:
            return StepState.UNAVAILABLE
        return StepState.NOT_YET_AVAILABLE

    def wait_for_steps(
        self, required_steps: Iterable[int], mode: ModeKeys = ModeKeys.GLOBAL, timeout: float | None = 600.0,
        poll_interval: float = 0.1,
    ) -> None:
        """Block until each step is available or known never to come.

        Raises:
            NoMoreData: training ended before one of the steps was written.
            WaitTimeout: ``timeout`` seconds passed first (``None`` waits without limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = sorted(set(required_steps))
        while True:
            self.refresh(force=True)
            pending = [step for step in pending if self.has_passed_step(step, mode) == StepState.NOT_YET_AVAILABLE]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"steps {pending[:10]} ({ModeKeys.parse(mode).name}) of {self.path} "
                    f"did not arrive within {timeout} s"
                )
            time.sleep(poll_interval)
        missing = [step for step in required_steps if self.has_passed_step(step, mode) == StepState.UNAVAILABLE]
        if missing and self._state.training_ended:
            raise NoMoreData(
                f"training ended before steps {missing[:10]} ({ModeKeys.parse(mode).name}) were written in {self.path}"
            )

    # -- internals used by Tensor -------------------------------------------------------------
    def _record(self, global_step: int) -> Any:
        self.refresh()
        record = self._state.steps.get(global_step)
        if record is None:
            raise self._missing_step_error(global_step, ModeKeys.GLOBAL)
        return record

    def _missing_step_error(self, step: int, mode: ModeKeys) -> TrialError:
        known = sorted(self._state.by_mode[mode])
        span = f"steps {known[0]}..{known[-1]}" if known else "no steps"
        if self._state.training_ended:
            unindexed = [key for key, (saved, _) in self._state.unindexed_event_files.items() if saved == step]
            if unindexed and mode == ModeKeys.GLOBAL:
                return StepUnavailable(
                    f"step {step} of {self.path} is damaged: {unindexed[0]} has no index file, so its tensors "
                    "cannot be read"
                )
            if known and step > known[-1]:
                return NoMoreData(f"step {step} ({mode.name}) is past the end of {self.path}, which has {span}")
            return StepUnavailable(f"step {step} ({mode.name}) was not saved in {self.path}, which has {span}")
        return StepNotYetAvailable(f"step {step} ({mode.name}) is not written yet in {self.path} ({span} so far)")

    def _global(self, step: int, mode: ModeKeys) -> int:
        global_step = self._state.by_mode[mode].get(step)
        if global_step is None:
            self.refresh(force=True)
            global_step = self._state.by_mode[mode].get(step)
        if global_step is None:
            raise self._missing_step_error(step, mode)
        return global_step

    def _tensor_steps(self, name: str, mode: ModeKeys, show_incomplete_steps: bool) -> list[int]:
        return list(self._shared_tensor_steps(name, mode, show_incomplete_steps))

    def _shared_tensor_steps(self, name: str, mode: ModeKeys, show_incomplete_steps: bool = False) -> list[int]:
        """A tensor's sorted steps, cached until it gets more; shared: callers must not change it."""
        self.refresh()
        mode = ModeKeys.parse(mode)
        state = self._state
        saved = len(state.tensors.get(name, ())) + sum(
            len(state.tensors[reduction]) for reduction in state.reductions_of.get(name, ())
        )
        version = (saved, None if show_incomplete_steps else state.last_complete_step())
        key = (name, mode, show_incomplete_steps)
        cached = self._tensor_steps_cache.get(key)
        if cached is None or cached[0] != version:
            cached = self._tensor_steps_cache[key] = (
                version, self._compute_tensor_steps(name, mode, show_incomplete_steps)
            )
        return cached[1]

    def _compute_tensor_steps(self, name: str, mode: ModeKeys, show_incomplete_steps: bool) -> list[int]:
        steps = []
        for global_step in self._saved_steps(name):
            record = self._state.steps[global_step]
            if not show_incomplete_steps and not self._state.is_complete(global_step):
                continue
            if mode == ModeKeys.GLOBAL:
                steps.append(global_step)
            elif record.mode == mode:
                steps.append(record.mode_step)
        return sorted(steps)

    def _tensor_workers(self, name: str, step: int, mode: ModeKeys) -> list[str]:
        global_step = self._global(step, ModeKeys.parse(mode))
        return sorted(self._state.tensors.get(name, {}).get(global_step, {}))

    def _saved_shape(self, name: str, step: int, mode: ModeKeys, worker: str | None) -> tuple[int, ...] | None:
        global_step = self._global(step, ModeKeys.parse(mode))
        by_worker = self._state.shapes.get(name, {}).get(global_step, {})
        if not by_worker:
            return None
        return by_worker[worker] if worker in by_worker else by_worker[sorted(by_worker)[0]]

    def _locate(self, name: str, global_step: int, mode: ModeKeys, step: int, worker: str | None) -> Location:
        if not self.has_tensor(name):
            raise TensorUnavailable(f"tensor {name!r} was not saved in {self.path}")
        by_worker = self._state.tensors.get(name, {}).get(global_step)
        if not by_worker:
            has_reductions = any(
                global_step in self._state.tensors[reduction] for reduction in self._state.reductions_of.get(name, ())
            )
            hint = "; only its reductions were saved (use reduction_value)" if has_reductions else ""
            raise TensorUnavailableForStep(
                f"tensor {name!r} was not saved at step {step} ({mode.name}) in {self.path}{hint}",
                has_reductions=has_reductions,
            )
        if worker is None:
            return by_worker[sorted(by_worker)[0]]
        if worker not in by_worker:
            if worker not in self._state.workers:
                raise InvalidWorker(
                    f"worker {worker!r} wrote nothing in {self.path}; workers: {sorted(self._state.workers)}"
                )
            raise TensorUnavailableForStep(f"worker {worker!r} did not save {name!r} at step {step} ({mode.name})")
        return by_worker[worker]

    def _read_values(self, names: list[str], step: int, mode: ModeKeys, worker: str | None) -> dict[str, np.ndarray]:
        mode = ModeKeys.parse(mode)
        global_step = self._global(step, mode)
        locations = {name: self._locate(name, global_step, mode, step, worker) for name in names}
        by_file: dict[str, list[tuple[str, Location]]] = {}
        for name, location in locations.items():
            by_file.setdefault(location.event_file, []).append((name, location))
        values: dict[str, np.ndarray] = {}
        for event_file, items in by_file.items():
            ranges = [(location.entry.start, location.entry.length) for _, location in items]
            chunks, buffer_size = self._event_reads.read(event_file, ranges)
            path = f"{self.path}/{event_file}"
            for (name, location), chunk in zip(items, chunks, strict=True):
                try:
                    values[name] = decode_record(
                        chunk, location.entry.start, location.entry.length, buffer_size, path,
                        location.entry.checksum, checksum_required=self._state.checksums_required,
                    )  # fmt: skip
                except FormatError as error:
                    self._note_damaged_record(event_file, name, global_step, error)
                    raise
        return values
