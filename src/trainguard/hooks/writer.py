"""The asynchronous step writer: the training thread hands tensors over, a thread writes them.

Ordering and visibility: a step's event file is committed first, then its index, so a reader
that sees an index always finds the event file it names. Memory is bounded: ``add_tensor``
blocks while more than ``max_pending_bytes`` wait to be written (backpressure, not an unbounded
queue), but never longer than ``max_block_seconds``: then the writer is declared stuck and
capture is disabled rather than hanging training. After ``fork()`` the child's copy of the
writer is disabled (DataLoader workers must not write, and the parent's thread does not exist
there); the parent keeps writing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from trainguard.format.index import IndexEntry, StepIndex, render_index
from trainguard.format.layout import event_key, index_key
from trainguard.format.record import FOOTER_SIZE, HEADER_SIZE, frame_footer, frame_header
from trainguard.format.tensor_codec import encode_scalar_events, encode_tensor_event
from trainguard.modes import ModeKeys
from trainguard.storage.base import Store

__all__ = ["StepWriter", "TensorSource"]

logger = logging.getLogger("trainguard")

# A tensor handed over is a numpy array, or a callable returning one (e.g. a device-to-host
# copy still in flight that the writer thread waits for), with an optional DataType override.
TensorSource = np.ndarray | Callable[[], np.ndarray]
_FOOTER = frame_footer()
# Record headers by payload length: scalar records of a run repeat a handful of lengths.
_HEADERS: dict[int, bytes] = {}


class StepWriter:
    """Writes one worker's steps to a store on a background thread."""

    def __init__(
        self,
        store: Store,
        worker: str,
        *,
        max_pending_bytes: int = 256 << 20,
        max_block_seconds: float = 60.0,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.worker = worker
        self.max_pending_bytes = max_pending_bytes
        self.max_block_seconds = max_block_seconds
        self._wake_bytes = min(self.WAKE_BYTES, max(1, max_pending_bytes // 4))
        self.bytes_written = 0
        self.steps_written = 0
        self.failure: BaseException | None = None
        self._on_error = on_error
        self._pid = os.getpid()
        self._reset_sync_state()
        self._thread = threading.Thread(target=self._run, name=f"trainguard-writer-{worker}", daemon=True)
        self._thread.start()
        self._closed = False
        self._disabled_by_fork = False
        self._reserve = self._reserve_space()
        reference = weakref.ref(self)

        def _in_child() -> None:
            writer = reference()
            if writer is not None:
                writer._after_fork_in_child()

        os.register_at_fork(after_in_child=_in_child)

    # Space held back on a local disk for the records written after a failure: when the disk
    # fills up, the hook still says that capture stopped, and where (capture_stopped/<worker>),
    # and rank 0 writes the end marker, instead of leaving readers to take a truncated run for a
    # complete one. Dot-files are invisible to stores, trials and the uploader.
    RESERVE_BYTES = 64 << 10

    def _reserve_space(self) -> str | None:
        root = getattr(self.store, "root", None)  # local stores only: S3 does not fill up
        if root is None:
            return None
        path = os.path.join(os.fspath(root), f".trainguard-reserve-{self.worker}")
        try:
            os.makedirs(os.fspath(root), exist_ok=True)
            with open(path, "wb") as file:
                os.posix_fallocate(file.fileno(), 0, self.RESERVE_BYTES)
        except (OSError, AttributeError):  # no room even now, or no fallocate: nothing held back
            self._release(path)
            return None
        return path

    @staticmethod
    def _release(path: str | None) -> None:
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass

    def write_after_failure(self, objects: list[tuple[str, bytes]]) -> None:
        """Write small objects directly (not through the failed writer thread), in the space held
        back at start: the record of why capture stopped, and the end marker. Best effort."""
        self._release(self._reserve)
        self._reserve = None
        for key, data in objects:
            try:
                self.store.write(key, data)
            except Exception as error:  # noqa: BLE001 - best effort: the failure was logged once already
                logger.debug("trainguard: could not write %s after capture stopped: %s", key, error)
                return

    def _reset_sync_state(self) -> None:
        self._queue: deque[tuple[Any, ...]] = deque()
        self._pending_bytes = 0
        self._condition = threading.Condition()

    def _after_fork_in_child(self) -> None:
        # The lock may have been held by the parent's writer thread at fork time; a fresh one is
        # the only safe state. The child never writes: its thread does not exist.
        self._reset_sync_state()
        self._disabled_by_fork = True

    @property
    def active(self) -> bool:
        return self.failure is None and not self._closed and not self._disabled_by_fork

    # -- training-thread side ---------------------------------------------------------------
    # A step's pieces (begin, tensors, reductions) are queued without waking the writer thread
    # until the step ends or this many bytes wait. A wake-up is a GIL hand-over and a context
    # switch, about 30 µs on a small CPU, where a step of reductions has a dozen pieces. Raw
    # tensors soon pass this and start writing while the step runs (with 4 MiB here, a small
    # model's saved step was written during the next steps instead, slowing them by 10-20 %).
    # (Queued under the lock all the same: hooks may fire on several threads, e.g.
    # nn.DataParallel's replicas.)
    WAKE_BYTES = 256 << 10

    def _put(self, item: tuple[Any, ...], nbytes: int = 0, *, wake: bool = True) -> None:
        if not self.active:
            return
        deadline = time.monotonic() + self.max_block_seconds
        with self._condition:
            while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.failure is not None:
                    self._fail(TimeoutError(f"writer for {self.store.url} made no progress for {self.max_block_seconds:.0f} s"))
                    return
                self._condition.notify_all()  # pieces queued without a wake-up must drain
                self._condition.wait(min(remaining, 0.5))
            self._queue.append(item)
            self._pending_bytes += nbytes
            if wake or self._pending_bytes >= self._wake_bytes:
                self._condition.notify_all()

    def begin_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        self._put(("begin", step, mode, mode_step), wake=False)

    def add_tensor(self, name: str, value: TensorSource, *, nbytes: int, proto_dtype: int | None = None) -> None:
        self._put(("tensor", name, value, proto_dtype, nbytes), nbytes, wake=False)

    def add_reductions(self, names: list[str], vector: TensorSource) -> None:
        """Several scalar tensors at once: ``names[i]`` gets element ``i`` of ``vector``."""
        self._put(("reductions", names, vector, None, 8 * len(names)), 8 * len(names), wake=False)

    def end_step(self) -> None:
        self._put(("end",))

    def abort_step(self) -> None:
        """Drop the open step: its event file is deleted, no index is written."""
        self._put(("abort",))

    def write_object(self, key: str, data: bytes) -> None:
        """Write a small object in order with the steps (collections file, end marker)."""
        self._put(("object", key, data))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed over is written. False on timeout."""
        if self._disabled_by_fork or not self._thread.is_alive():
            return not self._queue
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            self._condition.notify_all()  # pieces may be queued without a wake-up
            while self._queue or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._condition.wait(0.2 if remaining is None else min(remaining, 0.2))
        return True

    def close(self, timeout: float = 120.0) -> bool:
        """Write what is pending and stop the thread. Idempotent. False if it timed out."""
        if self._closed or self._disabled_by_fork:
            return True
        done = self.flush(timeout)
        self._closed = True
        with self._condition:
            self._queue.append(("stop",))
            self._condition.notify_all()
        self._thread.join(timeout=5.0 if done else 0.1)
        if self.failure is None:  # after a failure the space is kept for write_after_failure
            self._release(self._reserve)
            self._reserve = None
        return done

    # -- writer-thread side -----------------------------------------------------------------
    _busy = False

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
            if self._on_error is not None:
                try:
                    self._on_error(error)
                except Exception:  # never let error reporting take training down
                    logger.exception("trainguard: error handler failed")

    def _run(self) -> None:
        step_state: dict[str, Any] | None = None
        while True:
            with self._condition:
                while not self._queue:
                    self._busy = False
                    self._condition.notify_all()
                    self._condition.wait()
                item = self._queue.popleft()
                self._busy = True
            kind = item[0]
            if kind == "stop":
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
                return
            nbytes = item[4] if kind in ("tensor", "reductions") else 0
            try:
                if self.failure is None:
                    step_state = self._handle(item, step_state)
            except BaseException as error:  # noqa: BLE001 - any failure disables capture
                if step_state is not None and step_state.get("file") is not None:
                    try:
                        step_state["file"].abort()
                    except Exception:
                        pass
                step_state = None
                self._fail(error)
            finally:
                if nbytes:
                    with self._condition:
                        self._pending_bytes -= nbytes
                        self._condition.notify_all()

    def _handle(self, item: tuple[Any, ...], state: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = item[0]
        if kind == "begin":
            if state is not None:  # a step left open: finish it rather than lose it
                self._finish_step(state)
            _, step, mode, mode_step = item
            return {"step": step, "mode": mode, "mode_step": mode_step, "file": None, "offset": 0, "entries": [],
                    "reductions": []}  # fmt: skip
        if kind == "reductions":
            if state is None:
                return state
            _, names, vector, _, _ = item
            state["reductions"].append((names, vector))  # written together at the step's end
            return state
        if kind == "tensor":
            if state is None:
                return state
            _, name, value, proto_dtype, _ = item
            self._write_record(state, name, value() if callable(value) else value, proto_dtype)
            return state
        if kind == "end":
            if state is not None:
                self._finish_step(state)
            return None
        if kind == "abort":
            if state is not None and state["file"] is not None:
                state["file"].abort()
            return None
        if kind == "object":
            _, key, data = item
            self.store.write(key, data)
            return state
        raise AssertionError(f"unknown writer item {kind!r}")

    def _write_record(self, state: dict[str, Any], name: str, array: np.ndarray, proto_dtype: int | None) -> None:
        encoded = encode_tensor_event(
            name,
            array,
            step=state["step"],
            mode=state["mode"],
            mode_step=state["mode_step"],
            wall_time=time.time(),
            proto_dtype=proto_dtype,
        )
        if state["file"] is None:
            state["file"] = self.store.open_writer(event_key(state["step"], self.worker))
        file = state["file"]
        file.write(frame_header(encoded.length))
        file.write(encoded.prefix)
        if encoded.content.nbytes:
            file.write(encoded.content)
        file.write(_FOOTER)
        record_length = HEADER_SIZE + encoded.length + FOOTER_SIZE
        # The payload's checksum goes in the index (see IndexEntry.checksum): a flipped byte is
        # then a clear error on read, never a silently wrong value. zlib's CRC-32 is in C, always
        # installed, and drops the GIL on large buffers.
        checksum = zlib.crc32(encoded.prefix)
        if encoded.content.nbytes:
            checksum = zlib.crc32(encoded.content, checksum)
        state["entries"].append(IndexEntry(name, state["offset"], record_length, checksum))
        state["offset"] += record_length
        # Writing is background work: hand the GIL back after every record. Without this the
        # training thread, which drops the GIL in every torch op, can wait a whole switch
        # interval (5 ms) to get it back while this thread encodes (measured: 1.4x slowdown).
        time.sleep(0)

    def _write_scalar_records(self, state: dict[str, Any], names: list[str], values: np.ndarray) -> None:
        """A batch of scalar records (reductions) in one buffer and one write."""
        payloads = encode_scalar_events(
            names, values, step=state["step"], mode=state["mode"], mode_step=state["mode_step"], wall_time=time.time()
        )
        if state["file"] is None:
            state["file"] = self.store.open_writer(event_key(state["step"], self.worker))
        buffer = bytearray()
        for name, payload in zip(names, payloads, strict=True):
            header = _HEADERS.get(len(payload))
            if header is None:
                header = _HEADERS.setdefault(len(payload), frame_header(len(payload)))
            buffer += header
            buffer += payload
            buffer += _FOOTER
            record_length = HEADER_SIZE + len(payload) + FOOTER_SIZE
            state["entries"].append(IndexEntry(name, state["offset"], record_length, zlib.crc32(payload)))
            state["offset"] += record_length
        state["file"].write(bytes(buffer))
        time.sleep(0)  # hand the GIL back to training once per batch (see _write_record)

    def _write_reductions(self, state: dict[str, Any]) -> None:
        """All of a step's reductions: computed together, encoded as one batch, one write.

        Deferred reductions of one kind (e.g. CPU tensor copies) resolve in one call of their
        ``resolve_many``, which shares multi-tensor kernels between tensors; per-step pieces of
        the records (mode, step, wall time) are encoded once.
        """
        pending, state["reductions"] = state["reductions"], []
        if not pending:
            return
        vectors: list[Any] = [vector for _, vector in pending]
        batches: dict[Any, list[int]] = {}
        for index, vector in enumerate(vectors):
            resolve_many = getattr(type(vector), "resolve_many", None)
            if resolve_many is not None:
                batches.setdefault(resolve_many, []).append(index)
            elif callable(vector):
                vectors[index] = vector()
        for resolve_many, indices in batches.items():
            for index, resolved in zip(indices, resolve_many([vectors[index] for index in indices]), strict=True):
                vectors[index] = resolved
        names = [name for group, _ in pending for name in group]
        values = np.concatenate([np.asarray(vector, dtype=np.float64).reshape(-1) for vector in vectors])
        self._write_scalar_records(state, names, values)

    def _finish_step(self, state: dict[str, Any]) -> None:
        self._write_reductions(state)
        if state["file"] is None:
            return
        state["file"].commit()  # the event file first: an index must never name a missing file
        event_file = event_key(state["step"], self.worker)
        index = StepIndex(
            step=state["step"],
            worker=self.worker,
            mode=state["mode"],
            mode_step=state["mode_step"],
            event_file=event_file,
            tensors=state["entries"],
        )
        self.store.write(index_key(state["step"], self.worker), render_index(index))
        self.bytes_written += state["offset"]
        self.steps_written += 1
