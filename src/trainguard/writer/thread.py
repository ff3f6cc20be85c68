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
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trainguard.format.layout import CAPTURE_STOPPED_PREFIX
from trainguard.modes import ModeKeys
from trainguard.storage.base import Store
from trainguard.storage.capture_status import write_capture_status_aside
from trainguard.writer.step_file import StepFile

__all__ = ["StepWriter", "TensorItem", "TensorSource", "WriterBase", "resolve_reductions"]

logger = logging.getLogger("trainguard")

# A tensor handed over is a numpy array, or a callable returning one (e.g. a device-to-host
# copy still in flight that the writer thread waits for), with an optional DataType override.
TensorSource = np.ndarray | Callable[[], np.ndarray]
# What a saved step hands over in bulk: name, value, size in bytes, DataType override or None.
TensorItem = tuple[str, TensorSource, int, int | None]


class WriterBase:
    """What every step writer shares: failure state, space held back, and fork safety."""

    def __init__(
        self,
        store: Store,
        worker: str,
        *,
        max_pending_bytes: int,
        max_block_seconds: float,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self.store = store
        self.worker = worker
        self.max_pending_bytes = max_pending_bytes
        self.max_block_seconds = max_block_seconds
        self.failure: BaseException | None = None
        self._on_error = on_error
        self._closed = False
        self._disabled_by_fork = False
        # Wall seconds the training thread waited for this writer (its queue full): a cost of
        # saving that the training thread's CPU time, the overhead budget's clock, cannot see.
        self.blocked_seconds = 0.0
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

    def _release_reserve(self) -> None:
        if self.failure is None:  # after a failure the space is kept for write_after_failure
            self._release(self._reserve)
            self._reserve = None

    def write_after_failure(self, objects: list[tuple[str, bytes]]) -> None:
        """Write small objects directly (not through the failed writer), in the space held
        back at start: the record of why capture stopped, and the end marker. Best effort."""
        self._release(self._reserve)
        self._reserve = None
        for key, data in objects:
            try:
                self.store.write(key, data)
            except Exception as error:  # noqa: BLE001 - best effort: the failure was logged once already
                logger.debug("trainguard: could not write %s after capture stopped: %s", key, error)
                if key.startswith(CAPTURE_STOPPED_PREFIX):
                    write_capture_status_aside(self.store.url, key, data, error)
                return

    def _after_fork_in_child(self) -> None:
        self._disabled_by_fork = True

    def cpu_seconds(self) -> float | None:
        """CPU time the writer has used so far (None where it cannot be read): an overhead
        budget counts it, since on a busy machine it competes with training for a core."""
        return None

    def cost_seconds(self) -> float | None:
        """What the writer has cost training so far, for an overhead budget: its CPU time plus
        the seconds training waited for it; None where its CPU time cannot be read."""
        cpu = self.cpu_seconds()
        return None if cpu is None else cpu + self.blocked_seconds

    @property
    def active(self) -> bool:
        return self.failure is None and not self._closed and not self._disabled_by_fork

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
            if self._on_error is not None:
                try:
                    self._on_error(error)
                except Exception:  # never let error reporting take training down
                    logger.exception("trainguard: error handler failed")


class StepWriter(WriterBase):
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
        self._reset_sync_state()
        super().__init__(
            store, worker, max_pending_bytes=max_pending_bytes, max_block_seconds=max_block_seconds, on_error=on_error
        )
        self._wake_bytes = min(self.WAKE_BYTES, max(1, max_pending_bytes // 4))
        self.bytes_written = 0
        self.steps_written = 0
        self._thread = threading.Thread(target=self._run, name=f"trainguard-writer-{worker}", daemon=True)
        self._thread.start()

    def cpu_seconds(self) -> float | None:
        ident = self._thread.ident
        if ident is None or not hasattr(time, "pthread_getcpuclockid"):
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except OSError:  # the thread has ended
            return None

    def _reset_sync_state(self) -> None:
        self._queue: deque[tuple[Any, ...]] = deque()
        self._pending_bytes = 0
        self._condition = threading.Condition()

    def _after_fork_in_child(self) -> None:
        # The lock may have been held by the parent's writer thread at fork time; a fresh one is
        # the only safe state. The child never writes: its thread does not exist.
        self._reset_sync_state()
        super()._after_fork_in_child()

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
        with self._condition:
            if self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                if not self._wait_for_room(nbytes):
                    return
            self._queue.append(item)
            self._pending_bytes += nbytes
            if wake or self._pending_bytes >= self._wake_bytes:
                self._condition.notify_all()

    def _wait_for_room(self, nbytes: int) -> bool:
        """Under the condition's lock: wait until ``nbytes`` more fit the queue budget; False
        (capture disabled) when the writer makes no progress for max_block_seconds."""
        started = time.monotonic()
        deadline = started + self.max_block_seconds
        try:
            while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.failure is not None:
                    self._fail(
                        TimeoutError(f"writer for {self.store.url} made no progress for {self.max_block_seconds:.0f} s")
                    )
                    return False
                self._condition.notify_all()  # pieces queued without a wake-up must drain
                self._condition.wait(min(remaining, 0.5))
            return True
        finally:
            self.blocked_seconds += time.monotonic() - started

    def begin_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        self._put(("begin", step, mode, mode_step), wake=False)

    def add_tensor(self, name: str, value: TensorSource, *, nbytes: int, proto_dtype: int | None = None) -> None:
        self._put(("tensor", name, value, proto_dtype, nbytes), nbytes, wake=False)

    def add_tensors(self, items: Sequence[TensorItem]) -> None:
        """Several tensors of the open step at once: ``(name, value, nbytes, proto_dtype)`` each."""
        for name, value, nbytes, proto_dtype in items:
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
        self._release_reserve()
        return done

    # -- writer-thread side -----------------------------------------------------------------
    _busy = False

    def _run(self) -> None:
        step_file = StepFile(self.store, self.worker, pause=_hand_back_gil)
        reductions: list[tuple[list[str], Any]] = []  # the open step's, written at its end
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
                    self._handle(item, step_file, reductions)
            except BaseException as error:  # noqa: BLE001 - any failure disables capture
                _note_step(error, step_file.step)  # the step capture stopped at, not training's
                step_file.abort_quietly()
                reductions.clear()
                self._fail(error)
            finally:
                if nbytes:
                    with self._condition:
                        self._pending_bytes -= nbytes
                        self._condition.notify_all()
                self.bytes_written = step_file.bytes_written
                self.steps_written = step_file.steps_written

    def _handle(self, item: tuple[Any, ...], step_file: StepFile, reductions: list[tuple[list[str], Any]]) -> None:
        kind = item[0]
        if kind == "begin":
            if step_file.open:  # a step left open: finish it rather than lose it
                self._finish_step(step_file, reductions)
            step_file.begin(item[1], item[2], item[3])
        elif kind == "reductions":
            if step_file.open:
                reductions.append((item[1], item[2]))  # computed together at the step's end
        elif kind == "tensor":
            if step_file.open:
                _, name, value, proto_dtype, _ = item
                step_file.tensor(name, value() if callable(value) else value, proto_dtype)
        elif kind == "end":
            self._finish_step(step_file, reductions)
        elif kind == "abort":
            reductions.clear()
            step_file.abort()
        elif kind == "object":
            self.store.write(item[1], item[2])
        else:
            raise AssertionError(f"unknown writer item {kind!r}")

    def _finish_step(self, step_file: StepFile, reductions: list[tuple[list[str], Any]]) -> None:
        if reductions and step_file.open:
            names, values = resolve_reductions(reductions)
            step_file.scalars(names, values)
        reductions.clear()
        step_file.end()


def _hand_back_gil() -> None:
    # Writing is background work: hand the GIL back after every record. Without this the
    # training thread, which drops the GIL in every torch op, can wait a whole switch
    # interval (5 ms) to get it back while this thread encodes, and training slows down.
    time.sleep(0)


def resolve_reductions(pending: list[tuple[list[str], Any]]) -> tuple[list[str], np.ndarray]:
    """A step's reductions, computed together: (tensor names, float64 values).

    Deferred reductions of one kind (e.g. CPU tensor copies) resolve in one call of their
    ``resolve_many``, which shares multi-tensor kernels between tensors.
    """
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
    return names, values


def _note_step(error: BaseException, step: int | None) -> None:
    """Tell the hook which step was being written when ``error`` stopped capture (it reads
    ``error.step``, as on a writer process's error): training may be several steps further."""
    if step is not None and getattr(error, "step", None) is None:
        try:
            error.step = step  # type: ignore[attr-defined]
        except AttributeError:
            pass
