"""A run as the dashboard reads it: an incremental listing that forgets what it has drawn.

A :class:`~trainguard.trial.Trial` keeps one entry per tensor per step (rules ask for any tensor
at any step), so a server holding one per open run would grow with the runs' length. The
dashboard only needs each step once, to add its values to the bounded curves: this listing keeps
the index keys of the steps not yet read, the steps still waiting for a worker, and a bounded
tail of recent steps (for the histogram slider); a step read is forgotten.

Reading is in bulk, per file: a step's index file and its whole event file in one read each
(many files at once on remote stores), the records checked (framing, the index's CRC-32) and
decoded with :mod:`trainguard.format.fast_decode`. What a Trial would report as damage (an
unreadable index, entries without the run's promised checksum, an event file missing or without
an index, a corrupt record) is reported here too, by step, at most ``_MAX_DAMAGE`` of them.

Completeness follows the Trial: a step is complete once every worker wrote it, once a later step
is, or once training ended; a worker more than ``max_lag_steps`` behind is taken for stopped.
"""

from __future__ import annotations

import functools
import logging
import math
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainguard.config.collections import Collection, CollectionManager
from trainguard.errors import (
    ChecksumMissing,
    FormatError,
    MissingCollectionFiles,
    ObjectNotFound,
    StorageError,
    TensorUnavailableForStep,
)
from trainguard.format.crc32c import MAGIC_FOOTER, masked_crc32c
from trainguard.format.fast_decode import decode_tensor_event
from trainguard.format.index import StepIndex, declares_payload_checksums, parse_index
from trainguard.format.layout import (
    COLLECTIONS_PREFIX,
    END_OF_TRAINING,
    EVENTS_PREFIX,
    INDEX_PREFIX,
    index_key,
    is_collections_key,
    parse_event_key,
    parse_index_key,
)
from trainguard.format.record import parse_record
from trainguard.format.tensor_codec import _header_of_length_delimited, _key, _length_delimited, _varint, proto_dtype_of
from trainguard.storage.base import Store
from trainguard.storage.capture_status import status_dir_from_environment
from trainguard.trial.run_health import read_capture_stopped

__all__ = ["RunListing", "StepValues", "decode_entry", "load_collections"]

logger = logging.getLogger("trainguard")

_MAX_DAMAGE = 200
_MAX_NAME_SETS = 256
_FOOTER = struct.pack("<I", MAGIC_FOOTER)


@dataclass
class StepValues:
    """The selected values one worker saved at one step (``error``: why they are missing)."""

    step: int
    mode: str
    worker: str
    values: dict[str, np.ndarray] = field(default_factory=dict)
    error: str = ""


def load_collections(store: Store) -> tuple[dict[str, Collection], int, bool]:
    """(collections, number of workers, payload checksums declared) from the collections files."""
    keys = [key for key in store.list(COLLECTIONS_PREFIX) if is_collections_key(key)]
    if not keys:
        raise MissingCollectionFiles(
            f"{store.url} has no collections file yet ({COLLECTIONS_PREFIX}<worker>_collections.json)"
        )
    found: dict[str, Collection] = {}
    workers, checksums = 1, False
    for key in keys:
        data = store.read(key)
        try:
            parsed, count = CollectionManager.parse(data)
            checksums = checksums or declares_payload_checksums(CollectionManager.meta_of(data))
        except (ValueError, KeyError, TypeError) as error:
            raise MissingCollectionFiles(f"{store.url}/{key} is corrupt: {error}") from None
        workers = max(workers, count)
        for collection in parsed:
            found.setdefault(collection.name, collection)
    return found, workers, checksums


@functools.lru_cache(maxsize=4096)
def _length_checksum(length_bytes: bytes) -> int:
    # records of a tensor keep their length from step to step: the header CRC is computed once
    return masked_crc32c(length_bytes)


def decode_entry(
    buffer: memoryview, start: int, length: int, checksum: int | None, path: str, name: str | None = None
) -> np.ndarray:
    """The array of the framed record at ``start``/``length`` of a whole event file's ``buffer``;
    raises :class:`FormatError` for a short, corrupt or checksum-failing record."""
    chunk = buffer[start : start + length]
    if len(chunk) != length:
        raise FormatError(path, start, f"file ends before the {length}-byte record the index names")
    (size,) = struct.unpack_from("<Q", chunk)
    if (
        length == size + 16
        and struct.unpack_from("<I", chunk, 8)[0] == _length_checksum(bytes(chunk[:8]))
        and chunk[-4:] == _FOOTER
    ):
        payload = chunk[12:-4]
    else:  # anything unusual: the full parser, with its own errors
        payload, _ = parse_record(chunk, 0, path)
    if checksum is not None and zlib.crc32(payload) != checksum:
        raise FormatError(path, start, "record payload does not match its checksum in the index (corrupt file)")
    if name is None:
        return decode_tensor_event(bytes(payload), path, start).value
    return _decode(bytes(payload), name, path, start)


# (tensor name, payload length) -> (the bytes trainguard's encoder writes just before the
# content, the content's dtype and shape), or None where the payload is not laid out that way
_Template = tuple[bytes, np.dtype, tuple[int, ...]] | None
_TEMPLATES: dict[tuple[str, int], _Template] = {}
_MAX_TEMPLATES = 4096


def _decode(payload: bytes, name: str, path: str, start: int) -> np.ndarray:
    """:func:`decode_tensor_event`'s value, without parsing every field again at every step.

    The encoder writes a tensor's content last, right after its TensorProto fields (dtype,
    shape, content length), which stay the same from step to step. The first payload of a
    tensor (and length) is decoded in full and must end with that header and the decoded
    content; later ones whose bytes before the content are that header are read in place. Any
    other payload (smdebug's field order, strings, bfloat16, empty tensors) takes the full
    decoder, so values are the same as its."""
    key = (name, len(payload))
    if key not in _TEMPLATES:
        array = decode_tensor_event(payload, path, start).value
        template = _template_of(payload, array)
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            _TEMPLATES.clear()
        _TEMPLATES[key] = template
        return array
    template = _TEMPLATES[key]
    if template is not None:
        header, dtype, shape = template
        size = dtype.itemsize * math.prod(shape)
        if payload[len(payload) - size - len(header) : len(payload) - size] == header:
            return np.frombuffer(payload, dtype=dtype, offset=len(payload) - size).reshape(shape)
    return decode_tensor_event(payload, path, start).value


def _template_of(payload: bytes, array: np.ndarray) -> _Template:
    if array.size == 0 or array.dtype.kind not in "biuf":
        return None
    try:
        number = proto_dtype_of(array)
    except TypeError:
        return None
    dims = b"".join(_length_delimited(2, _key(1, 0) + _varint(int(size))) for size in array.shape)
    header = _key(1, 0) + _varint(number) + _length_delimited(2, dims) + _header_of_length_delimited(4, array.nbytes)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    content_at = len(payload) - array.nbytes
    if payload[content_at - len(header) : content_at] != header or payload[content_at:] != little.tobytes():
        return None
    return header, little.dtype, array.shape


class RunListing:
    """The steps of one run, listed incrementally and handed out once each by :meth:`read`."""

    def __init__(self, store: Store, *, recent_steps: int = 2000, max_lag_steps: int = 1000, batch: int = 64) -> None:
        self.store = store
        self.collections, self.num_workers, self.checksums_required = load_collections(store)
        self.max_lag_steps = max_lag_steps
        self.batch = batch
        self.training_ended = False
        self.steps = 0  # complete steps listed
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.workers: set[str] = set()
        self._token: str | None = None
        self._released = -1  # steps up to here are complete: later keys for them are ignored
        self._pending: dict[int, dict[str, str]] = {}  # listed, waiting for a worker: step -> worker -> key
        self._ready: deque[tuple[int, dict[str, str]]] = deque()  # complete, not read yet
        self._recent: deque[tuple[int, int]] = deque(maxlen=recent_steps)  # (step, id of the names saved)
        self._name_sets: dict[frozenset[str], int] = {}
        self._damage: dict[str, dict[str, Any]] = {}
        self._remote = getattr(store, "read_mapped", None) is None
        self._status_dir = status_dir_from_environment()

    # -- listing ---------------------------------------------------------------------------
    def refresh(self) -> int:
        """List the index files written since the last refresh; return how many were new."""
        if self.training_ended:
            return 0
        ended = self.store.exists(END_OF_TRAINING)  # before listing: all written before it is listed
        keys = self.store.list(INDEX_PREFIX, start_after=self._token)
        new = 0
        for key in keys:
            parsed = parse_index_key(key)
            if parsed is None or parsed.step <= self._released:
                continue
            workers = self._pending.setdefault(parsed.step, {})
            if parsed.worker not in workers:
                workers[parsed.worker] = key
                self.workers.add(parsed.worker)
                new += 1
        if new:  # hooks rewrite the collections file when tensors join a collection mid-run
            try:
                self.collections, self.num_workers, self.checksums_required = load_collections(self.store)
            except (MissingCollectionFiles, StorageError) as error:
                logger.debug("trainguard ui: collections of %s unreadable for now: %s", self.store.url, error)
        self._release(ended)
        if self._pending:  # list again from the oldest step still waiting for a worker
            oldest = min(self._pending)
            self._token = f"{INDEX_PREFIX}{oldest // 1000:09d}/{oldest:012d}"
        elif keys:
            self._token = max(keys[-1], self._token or "")
        if ended:
            self.training_ended = True
            self._find_unindexed_event_files()
        return new

    def _release(self, ended: bool) -> None:
        if not self._pending:
            return
        newest = max(self._pending)
        if ended:
            through = newest
        else:
            full = [step for step, workers in self._pending.items() if len(workers) >= self.num_workers]
            through = max(full) if full else -1
            through = max(through, newest - self.max_lag_steps)  # a worker that far behind has stopped
        for step in sorted(step for step in self._pending if step <= through):
            self._ready.append((step, self._pending.pop(step)))
            self.steps += 1
            self.first_step = step if self.first_step is None else self.first_step
            self.last_step = step
        self._released = max(self._released, through)

    def backlog(self) -> int:
        """Complete steps listed but not read yet."""
        return len(self._ready)

    def last_key(self) -> str | None:
        """The index key of the last complete step (its first worker), for its time."""
        if self.last_step is None or not self.workers:
            return None
        return index_key(self.last_step, min(self.workers))

    # -- reading ---------------------------------------------------------------------------
    def read(self, select: Callable[[str], bool], budget_s: float = 0.5) -> Iterator[StepValues]:
        """The values ``select`` wants of the complete steps not read yet, oldest first, for
        about ``budget_s``; each step is handed out once. A generator, batch by batch: the caller
        is done with a batch's values before the next is read."""
        started = time.monotonic()
        while self._ready and time.monotonic() - started <= budget_s:
            steps = [self._ready.popleft() for _ in range(min(self.batch, len(self._ready)))]
            jobs = [(step, worker, key) for step, workers in steps for worker, key in sorted(workers.items())]
            if self._remote and len(jobs) > 1:  # each file is its own request: many at once
                with ThreadPoolExecutor(8) as pool:
                    results = list(pool.map(lambda job: self._read_step(job[0], job[1], job[2], select), jobs))
            else:
                results = [self._read_step(step, worker, key, select) for step, worker, key in jobs]
            names_of: dict[int, set[str]] = {}
            for (step, _, _), (_, names) in zip(jobs, results, strict=True):
                names_of.setdefault(step, set()).update(names)
            for step, names_read in names_of.items():
                self._remember(step, frozenset(names_read))
            yield from (values for values, _ in results if values is not None)

    def _read_step(
        self, step: int, worker: str, key: str, select: Callable[[str], bool]
    ) -> tuple[StepValues | None, list[str]]:
        index = self._index(step, worker, key)
        if index is None:
            return None, []
        names = [entry.tensor_name for entry in index.tensors]
        result = StepValues(step, index.mode.name, worker)
        wanted = [entry for entry in index.tensors if select(entry.tensor_name)]
        if self.checksums_required and any(entry.checksum is None for entry in index.tensors):
            unchecked = [entry.tensor_name for entry in index.tensors if entry.checksum is None]
            shown = ", ".join(repr(name) for name in unchecked[:3]) + (" and more" if len(unchecked) > 3 else "")
            problem = f"index entries without the run's payload checksum (altered or damaged index): {shown}"
            said = (
                f"{self.store.url}/{key}: {len(unchecked)} of its {len(index.tensors)} entries have no crc32 although "
                f"this run checksums every payload (the index was altered or damaged): step {step} of {worker} "
                "cannot be trusted, its values are refused on read"
            )
            self._note(key, step, worker, problem, said)
            wanted = [entry for entry in wanted if entry.checksum is not None]  # refused, as a Trial does
        if not wanted or index.event_file is None:
            return result, names
        buffer = self._event_file(step, worker, index.event_file)
        if buffer is None:
            result.error = f"{index.event_file} is missing"
            return result, names
        path = f"{self.store.url}/{index.event_file}"
        try:
            for entry in wanted:
                result.values[entry.tensor_name] = decode_entry(
                    buffer, entry.start, entry.length, entry.checksum, path, entry.tensor_name
                )
        except FormatError as error:  # a damaged step costs that step, not the run
            self._note(index.event_file, step, worker, f"record at byte {error.offset}: {error.problem}")
            result.values, result.error = {}, str(error)
        return result, names

    def _index(self, step: int, worker: str, key: str) -> StepIndex | None:
        try:
            return parse_index(self.store.read(key), step=step, worker=worker, path=f"{self.store.url}/{key}")
        except (FormatError, ObjectNotFound) as error:
            said = f"unreadable index file, its step is damaged: {error}"
            self._note(key, step, worker, "unreadable index file (truncated or corrupt)", said)
        except StorageError as error:
            logger.warning("trainguard ui: cannot read %s/%s: %s", self.store.url, key, error)
        return None

    def _event_file(self, step: int, worker: str, key: str) -> memoryview | None:
        try:
            read_mapped = getattr(self.store, "read_mapped", None)  # local files: no copy
            return read_mapped(key) if read_mapped is not None else memoryview(self.store.read(key))
        except (ObjectNotFound, FileNotFoundError):
            self._note(key, step, worker, "event file named by an index but missing")
        except (StorageError, OSError) as error:
            logger.warning("trainguard ui: cannot read %s/%s: %s", self.store.url, key, error)
        return None

    def value(self, name: str, step: int, worker: str | None = None) -> np.ndarray:
        """One tensor at one step (the first worker that saved it, unless ``worker``)."""
        for candidate in [worker] if worker else sorted(self.workers):
            key = index_key(step, candidate)
            try:
                data = self.store.read(key)
            except ObjectNotFound:
                continue
            index = parse_index(data, step=step, worker=candidate, path=f"{self.store.url}/{key}")
            entry = next((entry for entry in index.tensors if entry.tensor_name == name), None)
            if entry is None or index.event_file is None:
                continue
            path = f"{self.store.url}/{index.event_file}"
            if entry.checksum is None and self.checksums_required:
                raise ChecksumMissing(
                    path, entry.start, "its index entry has no crc32 although this run checksums every payload"
                )
            buffer = memoryview(self.store.read(index.event_file, entry.start, entry.length))
            return np.array(decode_entry(buffer, 0, entry.length, entry.checksum, path))
        raise TensorUnavailableForStep(f"tensor {name!r} was not saved at step {step} in {self.store.url}")

    # -- what was saved recently ----------------------------------------------------------
    def _remember(self, step: int, names: frozenset[str]) -> None:
        if not names:
            return
        if names not in self._name_sets:
            if len(self._name_sets) >= _MAX_NAME_SETS:  # keep the sets the tail still refers to
                used = {number for _, number in self._recent}
                self._name_sets = {key: number for key, number in self._name_sets.items() if number in used}
            self._name_sets[names] = max(self._name_sets.values(), default=-1) + 1
        self._recent.append((step, self._name_sets[names]))

    def recent_steps(self) -> dict[str, list[int]]:
        """Tensor name -> the steps of the recent tail (``recent_steps`` steps) that saved it."""
        sets = {number: names for names, number in self._name_sets.items()}
        found: dict[str, list[int]] = {}
        for step, number in self._recent:
            for name in sets.get(number, ()):
                found.setdefault(name, []).append(step)
        return found

    # -- what is wrong ---------------------------------------------------------------------
    def _note(self, key: str, step: int | None, worker: str | None, problem: str, said: str = "") -> None:
        """Remember a damaged file, and say so once (``said``: the warning, as a Trial words it)."""
        if key not in self._damage and len(self._damage) < _MAX_DAMAGE:
            self._damage[key] = {"step": step, "worker": worker, "file": key, "problem": problem}
            logger.warning("trainguard: %s", said or f"{self.store.url}/{key}: {problem}")

    def damage(self) -> list[dict[str, Any]]:
        """Damaged files found so far, by step (at most ``_MAX_DAMAGE``)."""
        return sorted(self._damage.values(), key=lambda item: (item["step"] is None, item["step"] or 0, item["file"]))

    def _find_unindexed_event_files(self) -> None:
        # once, at the end: an event file without an index is a step whose index never came
        try:
            indexed = {
                (parsed.step, parsed.worker) for parsed in map(parse_index_key, self.store.list(INDEX_PREFIX)) if parsed
            }
            events = self.store.list(EVENTS_PREFIX)
        except StorageError as error:
            logger.warning("trainguard ui: cannot list %s to check for missing index files: %s", self.store.url, error)
            return
        for key in events:
            parsed = parse_event_key(key)
            if parsed is not None and parsed not in indexed:
                step, worker = parsed
                said = (
                    f"{self.store.url}/{key} has no index file ({index_key(step, worker)}): step {step} of {worker} is "
                    "missing from the run and its tensors are not readable (the writer stopped between the event "
                    "file and its index, or the index was lost)"
                )
                self._note(key, step, worker, f"event file without an index: step {step} of {worker} is missing", said)

    def capture_stopped(self) -> dict[str, dict[str, Any]]:
        """Workers whose hook stopped capturing early, with step and reason."""
        return read_capture_stopped(self.store, self._status_dir)
