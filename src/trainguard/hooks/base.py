"""Framework-independent hook logic: configuration, steps and modes, what to save, the writer.

Framework adapters (``hooks/pytorch.py``...) only translate framework events into the calls
below; everything about *whether* and *where* a tensor is saved lives here.

Steps: a step is opened lazily by the first thing that wants to save in it and closed by the
adapter at its boundary (optimizer step, next root forward, mode change or close). Step numbers
are global and increase across modes; each mode also counts its own ``mode_step``.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from trainguard.config.capture_config import DEFAULT_MAX_PENDING_BYTES, CaptureConfig
from trainguard.config.collections import Collection, CollectionManager
from trainguard.config.json_config import configure_collections
from trainguard.config.reduction_config import ReductionConfig
from trainguard.config.save_config import SaveConfig
from trainguard.errors import ConfigError
from trainguard.format.index import PAYLOAD_CHECKSUMS_META
from trainguard.format.layout import (
    collections_key,
    worker_name,
)
from trainguard.hooks.fail_open import log_disabled
from trainguard.hooks.hook_arguments import (
    capture_arguments,
    check_out_dir,
    included_collections,
    overhead_budget_of,
    writer_kind_of,
)
from trainguard.hooks.overhead_budget import (
    HEAVY,
    LIGHT,
    LIGHT_COLLECTIONS,
    QUIET,
)
from trainguard.hooks.run_end import (
    final_objects,
    flush_profilers,
    mark_end_after_peers,
    peer_wait_seconds,
    start_end_marker_thread,
)
from trainguard.hooks.save_plan import SavePlan, plan_of
from trainguard.hooks.save_schedule import SaveSchedule
from trainguard.modes import ModeKeys
from trainguard.storage import Store, open_store
from trainguard.storage.options import StorageOptions

if TYPE_CHECKING:
    # The writers load numpy and the protobuf codec: imported when a hook first saves (or, for a
    # hook that starts its writer process ahead, as it is created, never in a dry run), so that
    # checking a configuration (`trainguard run` validates one before starting training) does not.
    from trainguard.writer.process import ProcessStepWriter
    from trainguard.writer.spawn import WriterChild
    from trainguard.writer.thread import StepWriter, TensorItem, TensorSource

__all__ = ["BaseHook", "SavePlan"]

logger = logging.getLogger("trainguard")
_exiting = False  # set by the atexit close: training is over

# What every other rank saves under include_workers="one": the rank-local values the default
# rules need to check each worker (a loss that goes non-finite on one rank only). Gradients are
# not among them: in data-parallel training they are all-reduced, so rank 0's copy already holds
# every rank's non-finite values; weights are the same on every rank, which only each rank's
# replica fingerprint can show (ReplicaDivergence compares them).
OTHER_WORKERS_COLLECTIONS: tuple[str, ...] = ("losses", "scalars", "metrics", "sm_metrics", "replica_fingerprints")
# Which writer a hook uses unless told (Hook(writer=...) or TRAINGUARD_WRITER): the writer process
# for CPU training into a local directory (it keeps serialising and writing off the training
# process's GIL and core), the thread writer elsewhere.
DEFAULT_WRITER = "auto"


class BaseHook(SaveSchedule):
    """Configuration, step accounting and writing shared by every framework hook."""

    # The state a training step reads first lives in slots, inside the hook object itself (two
    # cache lines) rather than in its large __dict__: the PyTorch hook's optimizer post-hook and
    # the general path read several of these after forward, backward and the optimizer have
    # pushed the hook out of the CPU's caches, where each further cache line read costs.
    # Every other attribute stays in __dict__ (the bases give one).
    __slots__ = (
        "enabled",
        "step",
        "mode",
        "mode_steps",
        "saving_this_step",
        "include_collections",
        "_groups",
        "_groups_for",
        "_budget",
    )

    framework = "generic"
    default_collections: tuple[str, ...] = ("weights", "biases", "gradients", "losses", "default", "scalars")
    always_included: tuple[str, ...] = ("losses", "scalars")
    # Whether the hook starts its writer process as it is created, not at its first save
    # (writer/spawn.py says why): the PyTorch hook, whose writer mostly is one.
    starts_writer_ahead = False

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None = None,
        export_tensorboard: bool = False,
        tensorboard_dir: str | None = None,
        dry_run: bool = False,
        reduction_config: ReductionConfig | None = None,
        save_config: SaveConfig | None = None,
        include_regex: Sequence[str] | str | None = None,
        include_collections: Sequence[str] | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        *,
        config: CaptureConfig | None = None,
        collection_manager: CollectionManager | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        other_workers_collections: Sequence[str] | None = None,
        writer: str | None = None,
        overhead_budget: float | None = None,
        overhead_max_interval: int | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        region: str | None = None,
    ) -> None:
        """The capture's settings come as ``config`` (a :class:`CaptureConfig`) or as the
        arguments of the same names, smdebug's; not both.
        ``other_workers_collections``: with ``include_workers="one"``, the collections every
        rank but 0 still saves (default ``OTHER_WORKERS_COLLECTIONS``: losses, scalars and the
        replica fingerprint, a few numbers per saved step); ``()`` makes the other ranks write nothing at all.
        ``writer``: "thread", "process" (a writer process, for local directories) or "auto"
        (the process for CPU training into a local directory); default ``TRAINGUARD_WRITER``.
        ``overhead_budget``: a fraction of training time (0.02 = 2 %); after its first saves the
        hook saves on fewer of the configured TRAIN steps while saving costs more, the heavy
        collections first (see :mod:`trainguard.hooks.overhead_budget`); None: the schedule as
        configured. ``overhead_max_interval``: the longest the budget may space the heavy saves,
        in steps (default 500; ``trainguard run --rules`` uses 100, so live rules see a fault within
        a few hundred steps). ``endpoint_url``, ``profile``, ``region``: for an ``s3://`` out_dir
        (default: the environment, as :mod:`trainguard.storage.options` says)."""
        given = capture_arguments(locals())
        if config is None:
            config = CaptureConfig(**given)
        elif given:
            raise ConfigError(f"pass the capture settings as config= or as arguments, not both: got {', '.join(given)}")
        self.config = config
        out_dir = config.out_dir or os.environ.get("TRAINGUARD_OUT_DIR")
        if not out_dir:
            raise ConfigError("no out_dir given: pass Hook(out_dir=...) or set TRAINGUARD_OUT_DIR")
        writer = writer_kind_of(config.writer, DEFAULT_WRITER)
        self.writer_kind = writer
        self._budget = overhead_budget_of(config.overhead_budget, config.overhead_max_interval)
        self.out_dir = out_dir
        self.dry_run = dry_run
        self.export_tensorboard = config.export_tensorboard
        self.tensorboard_dir = config.tensorboard_dir
        self.include_workers = config.include_workers
        self.other_workers_collections = frozenset(
            OTHER_WORKERS_COLLECTIONS if config.other_workers_collections is None else config.other_workers_collections
        )
        # set when this process turns out to be a rank > 0 under include_workers="one"
        self._light_worker = False
        self.save_all = config.save_all
        self.save_config = config.save_config or SaveConfig()
        self.reduction_config = config.reduction_config or ReductionConfig(save_raw_tensor=True)
        self.collection_manager = configure_collections(
            collection_manager or CollectionManager.pytorch_defaults(), config.collection_configurations
        )
        self.include_collections = included_collections(
            self.collection_manager, config.include_collections, config.include_regex, config.save_all,
            self.default_collections, self.always_included,
        )  # fmt: skip
        self.storage_options = StorageOptions(config.endpoint_url, config.profile, config.region)
        self.store: Store = open_store(self.out_dir, **self.storage_options.store_kwargs())
        if not dry_run:
            check_out_dir(self.store, self.out_dir)

        self.enabled = True
        self.step = -1
        self.mode = ModeKeys.TRAIN
        self.mode_steps = {mode: -1 for mode in ModeKeys}
        self.step_open = False
        self.saving_this_step = False
        self._due: frozenset[str] = frozenset()
        # (tensor name, due collections) -> plan; adapters keep other per-schedule facts here
        # too (keys of their own shape), so that all of it is forgotten when collections change
        self._plan_cache: dict[tuple[Any, ...], Any] = {}
        self._collections_dirty = False
        self._stopped_because: dict[str, object] | None = None
        self._match_cache: dict[str, tuple[Collection, ...]] = {}
        self._schedules: dict[str, tuple[SaveConfig, SaveConfig]] = {}
        self._groups: list[tuple[SaveConfig, tuple[str, ...]]] | None = None
        self._groups_for = -1  # len(include_collections) the groups were built for
        self._writer: StepWriter | ProcessStepWriter | None = None
        self._worker: str | None = None
        self._num_workers = 1  # the workers a reader waits for: 1 under include_workers="one"
        self._world = 1
        self._max_pending_bytes = config.max_pending_bytes
        self._peer_wait_s = peer_wait_seconds()
        self._closed = False
        self._atexit_ref = weakref.WeakMethod(self.close)
        atexit.register(_close_at_exit, self._atexit_ref)
        self._started_writer: WriterChild | None = None
        if self.starts_writer_ahead and not dry_run:
            try:
                from trainguard.writer.opening import start_ahead

                self._started_writer = start_ahead(self.store, writer, config.max_pending_bytes)
            except Exception as error:  # noqa: BLE001 - fail open: the first save starts one, or says why not
                logger.debug("trainguard: writer process not started ahead: %s", error)

    # -- configuration ------------------------------------------------------------------------
    def get_collection(self, name: str) -> Collection:
        self._match_cache.clear()
        self._plan_cache.clear()
        self._groups = None  # the caller may change its schedule
        return self.collection_manager.get(name)

    def get_collections(self) -> dict[str, Collection]:
        return {collection.name: collection for collection in self.collection_manager}

    def add_collection(self, collection: Collection) -> None:
        self._match_cache.clear()
        self._plan_cache.clear()
        self._groups = None
        self.collection_manager._collections[collection.name] = collection
        if collection.name not in self.include_collections:
            self.include_collections.append(collection.name)

    # -- fail open ----------------------------------------------------------------------------
    def disable(self, reason: BaseException | str) -> None:
        if not self.enabled:
            return
        self.enabled = False
        # A writer process reports the step it was writing; training may be further on by then.
        failed_step = getattr(reason, "step", None)
        text = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
        step = self.step if failed_step is None else failed_step
        self._stopped_because = {"step": step, "reason": text, "time": time.time()}
        if self.saving_this_step and self._writer is not None:
            self._writer.abort_step()  # a half-written step must not leave its temp file behind
        self.saving_this_step = False
        log_disabled(f"{self.framework} hook writing to {self.out_dir}", reason)

    # -- workers ------------------------------------------------------------------------------
    def _rank_and_world(self) -> tuple[int, int]:
        """The adapter overrides this with its framework's distributed rank."""
        return 0, 1

    def _ensure_writer(self) -> StepWriter | ProcessStepWriter | None:
        if self._writer is not None:
            return self._writer
        if self.dry_run:
            return None
        started, self._started_writer = self._started_writer, None  # adopted, or stopped, here
        rank, world = self._rank_and_world()
        if self.include_workers == "one" and rank != 0:
            if not self.other_workers_collections:
                if started is not None:
                    started.discard()
                self.enabled = False  # not an error: only worker 0 writes
                logger.info("trainguard: worker %d does not write (include_workers='one')", rank)
                return None
            self._light_worker = True
            self._plan_cache.clear()
            logger.info("trainguard: worker %d saves only %s (include_workers='one')", rank,
                        ", ".join(sorted(self.other_workers_collections)))  # fmt: skip
        self._worker = worker_name(rank)
        self._world = world
        # Under "one", a step is complete when worker 0 wrote it: the other ranks' few scalars
        # come along (DDP keeps ranks in step) but are not waited for, so that a script that
        # creates the hook on rank 0 only is still read live.
        self._num_workers = world if self.include_workers == "all" else 1
        kind = self.writer_kind
        if kind == "auto" and self._tensors_off_cpu():
            kind = "thread"  # device copies are waited for off the training thread there
        if self._light_worker:
            # Rank 0 waits at its end for the ranks that write (hooks.run_end), known by their
            # collections file: written here, before any step, not when a writer process that
            # may still be starting gets to it.
            try:
                self.store.write(collections_key(self._worker), self._rendered_collections())
            except Exception as error:  # noqa: BLE001 - the writer writes it again; fail open
                logger.debug("trainguard: could not write the collections file of %s: %s", self._worker, error)
        from trainguard.writer.opening import open_step_writer

        self._writer = open_step_writer(
            self.store,
            self._worker,
            kind=kind,
            max_pending_bytes=self._max_pending_bytes,
            on_error=self.disable,
            started=started,
        )
        self._write_collections()
        return self._writer

    def _tensors_off_cpu(self) -> bool:
        """Adapter: whether the tensors saved live on an accelerator (the writer choice)."""
        return False

    def _write_collections(self) -> None:
        if self._writer is not None and self._worker is not None:
            self._writer.write_object(collections_key(self._worker), self._rendered_collections())

    def _rendered_collections(self) -> bytes:
        framework = self.framework if self.framework != "generic" else None
        # every writer writes through StepFile, which checksums each payload into the index
        facts = {**PAYLOAD_CHECKSUMS_META, **self._schedule_facts(), **self._run_facts()}
        return self.collection_manager.render(self._num_workers, framework, facts)

    def _run_facts(self) -> dict[str, object]:
        """Adapter: facts about how the run trains, for rules (the collections file's _meta)."""
        return {}

    # -- steps and modes ----------------------------------------------------------------------
    def set_mode(self, mode: ModeKeys) -> None:
        """Switch mode; the current step ends, the next one counts in the new mode."""
        mode = ModeKeys.parse(mode)
        if mode != self.mode:
            self.end_step()
            self.mode = mode

    def begin_step(self) -> None:
        if self.step_open:
            self.end_step()
        self.step += 1
        self.mode_steps[self.mode] += 1
        self.step_open = True
        self._due = self._due_collections(self.mode, self.mode_steps[self.mode])
        self.saving_this_step = bool(self._due) and self.enabled
        if self.saving_this_step:
            writer = self._ensure_writer()
            if writer is None:
                self.saving_this_step = False
                return
            if self._budget is not None:
                self._budget.mark(self.step, LIGHT if self._due <= LIGHT_COLLECTIONS else HEAVY, writer.cost_seconds)
            writer.begin_step(self.step, self.mode, self.mode_steps[self.mode])
            self._on_step_begin()
        elif self._budget is not None:
            self._budget.mark(self.step, QUIET)

    def end_step(self) -> None:
        if not self.step_open:
            return
        if self.saving_this_step and self.enabled:
            self._on_step_end()
            if self._collections_dirty:
                # Before the step's index: a live reader that sees the step also sees which
                # collections its new tensors belong to (rules select tensors by collection).
                self._collections_dirty = False
                self._write_collections()
            if self._writer is not None:
                self._writer.end_step()
        self.step_open = False
        self.saving_this_step = False

    def ensure_step(self) -> None:
        if not self.step_open:
            self.begin_step()

    def _on_step_begin(self) -> None:
        """Adapter: save what belongs at the start of a step (weights)."""

    def _on_step_end(self) -> None:
        """Adapter: hand over what was held back during the step (gradients, losses)."""

    # -- what to save -------------------------------------------------------------------------
    def _matching(self, tensor_name: str) -> tuple[Collection, ...]:
        found = self._match_cache.get(tensor_name)
        if found is None:
            found = tuple(
                collection
                for name in self.include_collections
                if (collection := self.collection_manager.get(name)).matches(tensor_name)
            )
            self._match_cache[tensor_name] = found
        return found

    def plan(self, tensor_name: str) -> SavePlan | None:
        """How to save ``tensor_name`` at this step, or None when it is not due."""
        if not self.saving_this_step:
            return None
        key = (tensor_name, self._due)
        if key in self._plan_cache:
            return self._plan_cache[key]
        due = [collection for collection in self._matching(tensor_name) if collection.name in self._due]
        if self._light_worker:
            due = [collection for collection in due if collection.name in self.other_workers_collections]
        plan = plan_of(due, self.reduction_config)
        self._plan_cache[key] = plan
        return plan

    def write_tensor(self, name: str, value: TensorSource, *, nbytes: int, proto_dtype: int | None = None) -> None:
        if self._writer is not None:
            self._writer.add_tensor(name, value, nbytes=nbytes, proto_dtype=proto_dtype)

    def write_tensors(self, items: list[TensorItem]) -> None:
        """Hand several tensors of the open step over at once (cheaper than one by one)."""
        if self._writer is not None and items:
            self._writer.add_tensors(items)

    # -- user API -----------------------------------------------------------------------------
    def add_to_collections(self, name: str, collections: Iterable[str] | str) -> list[str]:
        names = [collections] if isinstance(collections, str) else list(collections)
        for collection_name in names:
            collection = self.get_collection(collection_name)
            if name not in collection.tensor_names:
                collection.add_tensor_name(name)
                self._collections_dirty = True
            if collection_name not in self.include_collections:
                self.include_collections.append(collection_name)
                if self.step_open and self.saving_this_step and self._due:
                    # a collection included mid-step is due in this very step if its schedule says so
                    self._due = self._due_collections(self.mode, self.mode_steps[self.mode])
        return names

    def close(self) -> None:
        """End the current step, write everything pending and the end-of-training marker."""
        if self._closed:
            return
        self._closed = True
        if self._started_writer is not None:  # never adopted: no step was saved
            self._started_writer.discard()
            self._started_writer = None
        try:
            self.end_step()
            # Every worker, before its end key: worker 0 writes the run's end marker once the
            # other workers' end keys are there, and a rank whose timings came later was judged
            # "one rank's step timings only" by the rules that compare ranks.
            flush_profilers()
            writer = self._writer
            if writer is None:
                return
            self._write_collections()  # again: tensor names added during training
            if writer.failure is None:
                for key, data in self._final_objects():
                    writer.write_object(key, data)  # in order, after the last step
            done = writer.close()
            stuck = False
            if writer.failure is not None:  # the writer thread gave up (a full disk...), maybe just now
                # A store that hung (the writer timed out) would hang these writes too: skip them.
                stuck = isinstance(writer.failure, TimeoutError)
                writer.write_after_failure([] if stuck else self._final_objects())
            if not done:
                logger.warning("trainguard: gave up waiting for pending tensors of %s", self.out_dir)
            if self._waits_for_peers() and not stuck:
                mark = mark_end_after_peers if _exiting else start_end_marker_thread
                mark(self.store, self._world, self._peer_wait_s, only_writers=self.include_workers == "one")
            if self.export_tensorboard and writer.failure is None:
                self._export_tensorboard()
        except Exception as error:  # noqa: BLE001 - close runs at exit: never raise there
            log_disabled(f"{self.framework} hook close", error)

    def _final_objects(self) -> list[tuple[str, bytes]]:
        return final_objects(self._worker, self._world, stopped_because=self._stopped_because,
                             light_worker=self._light_worker)  # fmt: skip

    def _waits_for_peers(self) -> bool:
        """Worker 0 of a run of several workers writes the end marker after the others ended
        (see :mod:`trainguard.hooks.run_end`)."""
        return self._world > 1 and self._worker == worker_name(0)

    def _export_tensorboard(self) -> None:
        from trainguard.tensorboard import export_run

        target = self.tensorboard_dir or os.path.join(self.out_dir, "tensorboard")
        where = self.storage_options
        export_run(self.out_dir, target, endpoint_url=where.endpoint_url, profile=where.profile, region=where.region)

    def __enter__(self) -> BaseHook:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def step_writer(self) -> StepWriter | ProcessStepWriter | None:
        """The writer the open step goes to (None before the first save, or in a dry run)."""
        return self._writer

    @property
    def writer_failure(self) -> BaseException | None:
        return self._writer.failure if self._writer is not None else None


def _close_at_exit(reference: weakref.WeakMethod) -> None:
    global _exiting
    _exiting = True  # training is over: worker 0 waits for its peers on this thread
    close = reference()
    if close is not None:
        close()
