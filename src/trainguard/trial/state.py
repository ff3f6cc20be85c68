"""What a trial knows about a run: the steps, workers and tensors listed so far.

Following a live run is incremental: each refresh lists only index files after the last one
seen (``start_after``), and reads just those. Index files are read concurrently for remote
stores, because on S3 each is its own small object.
"""

from __future__ import annotations

import bisect
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from trainguard.errors import FormatError, ObjectNotFound, StorageError
from trainguard.format.index import IndexEntry, StepIndex, parse_index
from trainguard.format.layout import (
    END_OF_TRAINING,
    EVENTS_PREFIX,
    INDEX_PREFIX,
    IndexKey,
    index_key,
    parse_event_key,
    parse_index_key,
)
from trainguard.modes import ModeKeys
from trainguard.storage.base import Store

__all__ = ["REDUCTION_PREFIX", "Damage", "Location", "RunState", "StepRecord"]

REDUCTION_PREFIX = "smdebug/reductions/"

logger = logging.getLogger("trainguard")


# Forget listed index keys behind the listing token once this many are remembered.
_SEEN_PRUNE_AT = 4096
# A worker this many steps behind the newest is taken for stopped (killed, its capture ended):
# the live listing stops restarting at its last step, which would list every later key again on
# every refresh; the listing after the end marker still starts from the beginning for it.
_MAX_WORKER_LAG_STEPS = 1000


@dataclass(frozen=True)
class Location:
    """Where one tensor's value for one (step, worker) lives."""

    event_file: str
    entry: IndexEntry


@dataclass(frozen=True, order=True)
class Damage:
    """One damaged file of a run: the step (and worker) whose data it held, and what is wrong."""

    step: int | None
    worker: str | None
    key: str  # relative to the run root
    problem: str


@dataclass
class StepRecord:
    step: int
    mode: ModeKeys
    mode_step: int
    workers: dict[str, StepIndex] = field(default_factory=dict)


class RunState:
    """The listing side of a trial. Thread-safe; refresh is incremental."""

    def __init__(
        self, store: Store, num_workers: int, *, parallel_reads: int = 1, checksums_required: bool = False
    ) -> None:
        self.store = store
        self.num_workers = num_workers
        # the run's writer checksums every payload (its collections file says so): an index
        # entry without a checksum is damage, not a file written by smdebug
        self.checksums_required = checksums_required
        self.steps: dict[int, StepRecord] = {}
        self.by_mode: dict[ModeKeys, dict[int, int]] = {mode: {} for mode in ModeKeys}  # mode_step -> step
        self.tensors: dict[str, dict[int, dict[str, Location]]] = {}  # name -> step -> worker -> loc
        self.shapes: dict[str, dict[int, dict[str, tuple[int, ...]]]] = {}
        self.workers: set[str] = set()
        # worker -> the steps it wrote, sorted: a late worker's steps are found without a scan
        self.steps_of_worker: dict[str, list[int]] = {}
        # per mode, the names with a value (raw or reduction; a reduction counts for its base
        # tensor too) at some step of that mode: tensor_names(mode=...) without a scan of steps
        self.names_by_mode: dict[ModeKeys, set[str]] = {mode: set() for mode in ModeKeys}
        # base tensor name -> names of its saved reduction tensors (smdebug lists a tensor whose
        # reductions alone were saved under its own name too)
        self.reductions_of: dict[str, set[str]] = {}
        self.training_ended = False
        # last_complete_step() is asked for per step by readers: cache it until the state changes
        self._version = 0
        self._last_complete: tuple[int, int | None] = (-1, None)
        self.loaded_all_steps = False
        self.corrupt_index_files: list[str] = []
        # event file key -> its (step, worker), for event files that no index names once the
        # run has ended: the writer died between the two, or the index was lost
        self.unindexed_event_files: dict[str, tuple[int, str]] = {}
        # index key -> (step, worker, names) of index entries without the checksum the run
        # promised; their values are refused on read (ChecksumMissing)
        self.unchecksummed_indexes: dict[str, tuple[int, str, list[str]]] = {}
        self._token: str | None = None
        self._relist = False  # a worker appeared: list from the start again (see _advance_token)
        self._lagging_worker = False  # a worker fell _MAX_WORKER_LAG_STEPS behind
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._parallel_reads = parallel_reads

    def refresh(self) -> int:
        """Read index files written since the last refresh; return how many were new."""
        with self._lock:
            if self.loaded_all_steps:
                return 0
            # Check the end marker *before* listing: whatever was written before the marker is
            # then guaranteed to be in this listing, so the run is complete after it.
            ended = self.store.exists(END_OF_TRAINING)
            added = self._read_new_indexes()
            if ended and (self._relist or self._lagging_worker):
                # A worker first seen in this last listing (or one the listing stopped waiting
                # for) may have steps behind the token: after the end marker there is no later
                # refresh to find them.
                self._token = None
                added += self._read_new_indexes()
            if ended:
                self.training_ended = True
                self._version += 1
                self.loaded_all_steps = True
                self._find_unindexed_event_files()
            return added

    def _find_unindexed_event_files(self) -> None:
        """Report event files without an index, once, when the run is known to be complete.

        A step's event file is written before its index, so during a live run an event file
        alone is a step being written; after the end marker it is a step whose index never came.
        Its tensors cannot be read (offsets and names are in the index), and the step is not
        counted as saved by that worker: say so instead of dropping it without a word.
        """
        try:
            keys = self.store.list(EVENTS_PREFIX)
        except StorageError as error:
            logger.warning(
                "trainguard: could not list %s/%s to check for missing index files: %s",
                self.store.url, EVENTS_PREFIX, error,
            )
            return
        unread = [parsed for parsed in map(parse_event_key, keys) if parsed is not None and not self._has(*parsed)]
        if unread:
            # An index that reached the store after the listing had moved past its key (an
            # endpoint emptied and filled again out of order) is not damage: read it now.
            self._read_missed_indexes({index_key(step, worker) for step, worker in unread})
        corrupt = set(self.corrupt_index_files)
        for key in keys:
            parsed = parse_event_key(key)
            if parsed is None:
                continue
            step, worker = parsed
            if self._has(step, worker):
                continue
            if index_key(step, worker) in corrupt:
                continue  # already reported as unreadable
            self.unindexed_event_files[key] = (step, worker)
            logger.warning(
                "trainguard: %s/%s has no index file (%s): step %d of %s is missing from the run and its tensors "
                "are not readable (the writer stopped between the event file and its index, or the index was lost)",
                self.store.url, key, index_key(step, worker), step, worker,
            )

    def _has(self, step: int, worker: str) -> bool:
        record = self.steps.get(step)
        return record is not None and worker in record.workers

    def _read_missed_indexes(self, wanted: set[str]) -> None:
        try:
            present = [key for key in self.store.list(INDEX_PREFIX) if key in wanted and key not in self._seen]
        except StorageError as error:
            logger.warning(
                "trainguard: could not list %s/%s again for late index files: %s", self.store.url, INDEX_PREFIX, error
            )
            return
        for key in present:
            parsed = parse_index_key(key)
            if parsed is None:
                continue
            try:
                index = parse_index(
                    self.store.read(key), step=parsed.step, worker=parsed.worker, path=f"{self.store.url}/{key}"
                )
            except (FormatError, ObjectNotFound) as error:
                logger.warning("trainguard: unreadable index file, its step is damaged: %s", error)
                self.corrupt_index_files.append(key)
                continue
            self._seen.add(key)
            self._add(index)

    def _read_new_indexes(self) -> int:
        self._relist = False
        keys = self.store.list(INDEX_PREFIX, start_after=self._token)
        parsed = [
            key for key in (parse_index_key(key) for key in keys) if key is not None and key.key not in self._seen
        ]
        if not parsed:
            self._advance_token(keys)
            return 0

        def load(index_key: IndexKey) -> StepIndex | FormatError | ObjectNotFound:
            try:
                data = self.store.read(index_key.key)
                return parse_index(
                    data, step=index_key.step, worker=index_key.worker, path=f"{self.store.url}/{index_key.key}"
                )
            except (FormatError, ObjectNotFound) as error:
                return error

        if self._parallel_reads > 1 and len(parsed) > 1:
            with ThreadPoolExecutor(self._parallel_reads) as pool:
                results = list(pool.map(load, parsed))
        else:
            results = [load(key) for key in parsed]
        added = 0
        for parsed_key, result in zip(parsed, results, strict=False):
            if isinstance(result, BaseException):
                # A bad index never stops the reader: it is reported, the rest stays readable.
                logger.warning("trainguard: unreadable index file, its step is damaged: %s", result)
                self.corrupt_index_files.append(parsed_key.key)
                continue
            self._add(result)
            added += 1
        self._seen.update(key.key for key in parsed)
        self._advance_token(keys)
        return added

    def _advance_token(self, keys: list[str]) -> None:
        """Move the listing start past everything that cannot change any more.

        With several workers, a slow worker's index for step 5 may land after a fast worker's
        step 6 was listed; its key sorts earlier, so the listing restarts at the oldest step
        still missing a worker (keys already read are skipped by ``_seen``). Workers a reader
        does not wait for (the other ranks' losses under ``include_workers="one"``) lag too:
        the listing also restarts at the last step of the worker furthest behind (each worker
        writes its steps in order), and from the very start when a worker appears for the first
        time (its earlier steps sort before what was listed).
        """
        if self._relist:
            self._token = None
            return
        if not keys:
            return
        last_complete = self.last_complete_step()
        waiting = [
            step
            for step, record in self.steps.items()
            if len(record.workers) < self.num_workers and (last_complete is None or step > last_complete)
        ]
        if len(self.steps_of_worker) > 1:
            behind = min(steps[-1] for steps in self.steps_of_worker.values())
            if max(self.steps) - behind <= _MAX_WORKER_LAG_STEPS:
                waiting.append(behind)
            else:
                self._lagging_worker = True
        if waiting:
            oldest = min(waiting)
            self._token = f"{INDEX_PREFIX}{oldest // 1000:09d}/{oldest:012d}"
        else:
            self._token = max(keys[-1], self._token or "")
        if len(self._seen) > _SEEN_PRUNE_AT:
            # Keys at or before the token are never listed again: forget them (bounded memory).
            self._seen = {key for key in self._seen if key > self._token}

    def damage(self) -> list[Damage]:
        """Damaged index files and event files without an index found by listing, by step."""
        found = []
        for key in self.corrupt_index_files:
            parsed = parse_index_key(key)
            step, worker = (parsed.step, parsed.worker) if parsed is not None else (None, None)
            found.append(Damage(step, worker, key, "unreadable index file (truncated or corrupt)"))
        for key, (step, worker) in self.unindexed_event_files.items():
            found.append(Damage(step, worker, key, f"event file without an index: step {step} of {worker} is missing"))
        for key, (step, worker, names) in self.unchecksummed_indexes.items():
            shown = ", ".join(repr(name) for name in names[:3])
            shown += f" and {len(names) - 3} more" if len(names) > 3 else ""
            problem = f"index entries without the run's payload checksum (altered or damaged index): {shown}"
            found.append(Damage(step, worker, key, problem))
        return found

    def _note_missing_checksums(self, index: StepIndex) -> None:
        names = [entry.tensor_name for entry in index.tensors if entry.checksum is None]
        if not names or index.event_file is None:
            return
        key = index_key(index.step, index.worker)
        if key not in self.unchecksummed_indexes:
            self.unchecksummed_indexes[key] = (index.step, index.worker, names)
            logger.warning(
                "trainguard: %s/%s: %d of its %d entries have no crc32 although this run checksums every payload "
                "(the index was altered or damaged): step %d of %s cannot be trusted, its values are refused on read",
                self.store.url, key, len(names), len(index.tensors), index.step, index.worker,
            )  # fmt: skip

    def _add(self, index: StepIndex) -> None:
        if self.checksums_required:
            self._note_missing_checksums(index)
        self._version += 1
        record = self.steps.get(index.step)
        if record is None:
            record = self.steps[index.step] = StepRecord(index.step, index.mode, index.mode_step)
            if index.mode != ModeKeys.GLOBAL:
                self.by_mode[index.mode][index.mode_step] = index.step
            # GLOBAL is addressed by global step, whatever mode_step a GLOBAL-mode step carries
            self.by_mode[ModeKeys.GLOBAL][index.step] = index.step
        if index.worker not in record.workers:
            steps = self.steps_of_worker.get(index.worker)
            if steps is None:
                steps = self.steps_of_worker[index.worker] = []
                if len(self.steps_of_worker) > 1:
                    self._relist = True
            if not steps or steps[-1] < index.step:
                steps.append(index.step)
            else:
                bisect.insort(steps, index.step)
        record.workers[index.worker] = index
        self.workers.add(index.worker)
        names_of_mode = self.names_by_mode[record.mode]
        for entry in index.tensors:
            if index.event_file is None:
                continue
            self.tensors.setdefault(entry.tensor_name, {}).setdefault(index.step, {})[index.worker] = Location(
                index.event_file, entry
            )
            names_of_mode.add(entry.tensor_name)
            if entry.tensor_name.startswith(REDUCTION_PREFIX):
                _, _, base = entry.tensor_name[len(REDUCTION_PREFIX) :].partition("/")
                self.reductions_of.setdefault(base, set()).add(entry.tensor_name)
                names_of_mode.add(base)
        for name, shape in index.shapes.items():
            self.shapes.setdefault(name, {}).setdefault(index.step, {})[index.worker] = shape

    # -- completeness -------------------------------------------------------------------------
    def last_complete_step(self) -> int | None:
        """A step is complete when every worker wrote it, when training ended, or when a later
        step is complete (a worker that skipped a step will not come back to it)."""
        version, cached = self._last_complete
        if version == self._version:
            return cached
        if not self.steps:
            result = None
        elif self.training_ended:
            result = max(self.steps)
        else:
            complete = [step for step, record in self.steps.items() if len(record.workers) >= self.num_workers]
            result = max(complete) if complete else None
        self._last_complete = (self._version, result)
        return result

    def is_complete(self, step: int) -> bool:
        last = self.last_complete_step()
        return step in self.steps and last is not None and step <= last
