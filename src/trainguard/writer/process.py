"""The step writer as a separate process: serialising, reducing and writing leave the training
process, so they never take the GIL from training and can run on another core.

The training thread copies each tensor into a shared-memory ring (one memcpy) and queues a small
descriptor; a step's descriptors go down a pipe in one message when the step ends (or once a
quarter MiB of tensors waits, so a large step starts writing early). The writer process
(child.py, started with ``subprocess``, never ``multiprocessing``, which would re-import
the user's ``__main__``) computes CPU reductions with numpy on one BLAS thread, encodes and writes
the records with the same code as the thread writer (step_file.py), and releases ring space in
order by advancing a counter in the ring's header. Tensors larger than a quarter of the ring get
a shared-memory file of their own. Every shared-memory file is fully allocated up front, so a
full /dev/shm is an error at allocation (then the tensor goes down the pipe), never a SIGBUS.

Fail open: if the process dies, fails, or makes no progress for ``max_block_seconds`` while
training waits for space, capture is disabled with the reason and training goes on. If the
training process dies, the writer process reads end-of-file, writes every step it was told about
and exits; it ignores SIGINT and SIGTERM for that reason (a Ctrl-C reaches the whole group).
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
import select
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

import numpy as np

from trainguard.errors import TrainguardError
from trainguard.modes import ModeKeys
from trainguard.priority import nice_from_environment
from trainguard.storage.base import Store
from trainguard.storage.local import LocalStore
from trainguard.writer.ring import (
    ALIGN,
    FRAME_HEAD,
    HEADER_BYTES,
    SLOT_BYTES_WRITTEN,
    SLOT_FAILED,
    SLOT_FAILED_STEP,
    SLOT_FRAMES_DONE,
    SLOT_READY,
    SLOT_SEGMENT_BYTES_DONE,
    SLOT_STEPS_WRITTEN,
    SLOT_TAIL,
    SLOTS,
    read_error,
)
from trainguard.writer.spawn import (
    WriterChild,
    WriterUnavailable,
    allocate_shared_file,
    close_quietly,
    shared_memory_dir,
    unlink_quietly,
)
from trainguard.writer.thread import TensorItem, TensorSource, WriterBase

__all__ = [
    "ProcessStepWriter",
    "WriterProcessError",
    "WriterUnavailable",
    "allocate_shared_file",
    "shared_memory_dir",
]

logger = logging.getLogger("trainguard")

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WriterProcessError(TrainguardError):
    """The writer process failed; ``step`` is the step it was writing (training is further on)."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    # Hooks may fire on several threads at once (e.g. nn.DataParallel's replicas); the ring's
    # position and the open message must change under one lock. Re-entrant: a failure calls the
    # hook's error handler, which aborts the step through this writer.
    @wraps(method)
    def call(self: ProcessStepWriter, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return call


class ProcessStepWriter(WriterBase):
    """Writes one worker's steps to a local store from a separate process."""

    # Tensors over a quarter of it get their own shared-memory file. The ring is allocated in full
    # (fallocate: no SIGBUS later), so it is kept small; a step's small tensors reuse its start.
    RING_BYTES = 8 << 20
    # add_tensor copies a numpy array into shared memory before it returns: a caller may hand
    # over a view of memory it will change afterwards.
    copies_at_hand_over = True
    WAKE_BYTES = 256 << 10  # descriptors go out before the step ends once this many bytes wait
    START_SECONDS = 30.0  # a writer process not running by then counts as failed
    NICE = 10  # see child.main; TRAINGUARD_WRITER_NICE (0-19) overrides

    def __init__(
        self,
        store: Store,
        worker: str,
        *,
        max_pending_bytes: int = 256 << 20,
        max_block_seconds: float = 60.0,
        on_error: Callable[[BaseException], None] | None = None,
        ring_bytes: int | None = None,
        started: WriterChild | None = None,
    ) -> None:
        """``started``: a writer process started ahead (:func:`start_ahead`), adopted if it
        fits this writer, else stopped and a new one started."""
        self.nice = nice_from_environment("TRAINGUARD_WRITER_NICE", self.NICE)
        if not isinstance(store, LocalStore):
            if started is not None:
                started.discard()
            raise WriterUnavailable(f"the writer process writes to local directories only, not {store.url}")
        self._ring_size = self.ring_size_for(max_pending_bytes, ring_bytes)
        root = os.fspath(store.root)
        if started is not None and not started.adoptable(root, self._ring_size):
            started.discard()
            started = None
        child = started or WriterChild(root, self._ring_size, self.nice, worker)
        self._shm_path, self._map, self._pipe = child.shm_path, child.map, child.pipe
        self._process, self._started = child.process, child.started
        child.hand_over()
        self._slots = np.frombuffer(self._map, dtype=np.uint64, count=SLOTS)
        self._ring = np.frombuffer(self._map, dtype=np.uint8, offset=HEADER_BYTES)
        self._head = 0  # ring bytes handed out (a position, only grows)
        self._free_through = 0  # ring positions below this are free whatever the process says
        self._segment_bytes_sent = 0
        self._batch: list[tuple[Any, ...]] = []
        self._batch_bytes = 0
        self._frames_sent = 0
        self._lock = threading.RLock()
        super().__init__(
            store, worker, max_pending_bytes=max_pending_bytes, max_block_seconds=max_block_seconds, on_error=on_error
        )
        if not child.named:
            self._batch.append(("worker", worker))  # before anything else it is told
            self._send_batch()

    @classmethod
    def ring_size_for(cls, max_pending_bytes: int, ring_bytes: int | None = None) -> int:
        """The ring a writer with this queue budget maps (at most ``RING_BYTES``)."""
        ring = min(ring_bytes or cls.RING_BYTES, max(max_pending_bytes, 1 << 20))
        return max(ALIGN, ring - ring % ALIGN)

    # -- training-thread side -------------------------------------------------------------
    @property
    def bytes_written(self) -> int:
        return int(self._slots[SLOT_BYTES_WRITTEN])

    @property
    def steps_written(self) -> int:
        return int(self._slots[SLOT_STEPS_WRITTEN])

    @property
    def ring_size(self) -> int:
        return self._ring_size

    @property
    def pid(self) -> int:
        return self._process.pid

    def cpu_seconds(self) -> float | None:
        # None until the process is ready: its start-up (interpreter, imports: ~0.4 s of CPU)
        # is paid once, and an overhead budget window holding it would read it as the cost of
        # its few saves. utime and stime of /proc/<pid>/stat (fields 14 and 15, counted after
        # the command name, which may hold spaces); in clock ticks.
        if not self._slots[SLOT_READY]:
            return None
        try:
            with open(f"/proc/{self._process.pid}/stat", "rb") as file:
                fields = file.read().rpartition(b")")[2].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, ValueError, IndexError):
            return None

    @_locked
    def begin_step(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        if self._usable():
            self._batch.append(("begin", step, mode, mode_step))

    def add_tensor(self, name: str, value: TensorSource, *, nbytes: int, proto_dtype: int | None = None) -> None:
        self.add_tensors(((name, value, nbytes, proto_dtype),))

    @_locked
    def add_tensors(self, items: Sequence[TensorItem]) -> None:
        """A step's tensors in one call (a saved step's parameters, its gradients): one lock,
        one check and one look at the process's progress for all of them."""
        if not self._usable():
            return
        place = self._place
        for name, value, _, proto_dtype in items:
            array = value() if callable(value) else value  # e.g. a device copy: waited for here
            placed = place(array if type(array) is np.ndarray else np.asarray(array))
            if placed is None:
                return  # the writer failed or stalled: capture is off
            # (not a local alias of the batch: waiting for space may send it and start a new one)
            self._batch.append(("tensor", name, placed, proto_dtype))
            self._batch_bytes += placed[2]
        if self._batch_bytes >= self.WAKE_BYTES:
            self._send_batch()

    @_locked
    def add_reductions(self, names: list[str], vector: TensorSource) -> None:
        """Several scalar tensors at once: ``names[i]`` gets element ``i`` of ``vector``;
        a deferred CPU reduction (``host_array()``, ``requested``) is computed by the process."""
        if not self._usable():
            return
        host_array = getattr(vector, "host_array", None)
        if host_array is not None:
            placed = self._place(host_array())
            if placed is not None:
                self._queue(("reduce", names, vector.requested, placed), placed[2])  # type: ignore[union-attr]
            return
        values = np.asarray(vector() if callable(vector) else vector, dtype=np.float64).reshape(-1)
        self._queue(("scalars", names, values.tolist()), 0)

    @_locked
    def end_step(self) -> None:
        if self._usable():
            self._batch.append(("end",))
            self._send_batch()

    @_locked
    def abort_step(self) -> None:
        """Drop the open step: its event file is deleted, no index is written."""
        if self._usable():
            self._batch.append(("abort",))
            self._send_batch()

    @_locked
    def write_object(self, key: str, data: bytes) -> None:
        """Write a small object in order with the steps (collections file, end marker)."""
        if self._usable():
            self._batch.append(("object", key, bytes(data)))
            self._send_batch()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed over is written. False on timeout."""
        if self._disabled_by_fork:
            return True
        with self._lock:
            if self._usable():
                self._send_batch()
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while int(self._slots[SLOT_FRAMES_DONE]) < self._frames_sent:
            if self._check_process() is not None:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        self._check_process()
        return True

    def close(self, timeout: float = 120.0) -> bool:
        """Write what is pending and stop the process. Idempotent. False if it timed out."""
        if self._closed or self._disabled_by_fork:
            return True
        done = self.flush(timeout)
        with self._lock:
            if self.failure is None:
                self._batch.append(("stop",))
                self._send_batch()
        self._closed = True
        self._close_pipe()
        try:
            self._process.wait(timeout=5.0 if done else 0.1)
        except subprocess.TimeoutExpired:
            self._process.kill()  # it made no progress: only pending writes are lost
            self._process.wait()
        self._discard_shared_memory()
        self._release_reserve()
        return done

    # -- internals ------------------------------------------------------------------------
    def _usable(self) -> bool:
        if not self.active:
            return False
        if self._slots[SLOT_FAILED]:
            self._check_process()
            return False
        return True

    def _queue(self, item: tuple[Any, ...], nbytes: int) -> None:
        self._batch.append(item)
        self._batch_bytes += nbytes
        if self._batch_bytes >= self.WAKE_BYTES:
            self._send_batch()

    def _place(self, array: np.ndarray) -> tuple[Any, ...] | None:
        """Copy ``array`` to shared memory: ("ring", start, nbytes, dtype, shape, release position)
        or ("file", path, nbytes, dtype, shape) or ("inline", array, nbytes)."""
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        nbytes = array.nbytes
        if array.dtype.hasobject:
            return ("inline", array, 0)
        if nbytes > self._ring_size >> 2:
            return self._place_in_own_file(array)
        size = (nbytes + ALIGN - 1) & -ALIGN or ALIGN
        tail = self._tail()  # read once: the process only moves it forward (more room, never less)
        if tail == self._head and self._head % self._ring_size:
            # Everything was released: start over at the ring's start, so that a model whose
            # saved steps are small keeps touching the same few pages (resident memory stays small).
            self._head += self._ring_size - self._head % self._ring_size
            self._free_through = tail = self._head
        start = self._head % self._ring_size
        skip = self._ring_size - start if start + size > self._ring_size else 0
        # The common case inline (a saved step places a dozen small tensors): is there room?
        free = self._ring_size - (self._head - tail)
        if skip + size > free and self._pending() + nbytes <= self.max_pending_bytes:
            # The ring is full but the queue budget is not: a file of its own instead of waiting
            # for the writer process. A saved step larger than the ring (a CNN's activations) used
            # to hold training up until the process caught up, and the process, at nice 10 behind
            # the rule runner on the other core, could take a whole step's time doing so.
            return self._place_in_own_file(array)
        if skip + size > free or self._segment_bytes_sent != int(self._slots[SLOT_SEGMENT_BYTES_DONE]):
            if not self._wait_for_space(skip + size):
                return None
        start = (self._head + skip) % self._ring_size
        self._head += skip + size
        if nbytes:
            begin = HEADER_BYTES + start
            # one memcpy; numpy's stubs do not declare ndarray a Buffer
            self._map[begin : begin + nbytes] = memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        return ("ring", start, nbytes, array.dtype.str, array.shape, self._head)

    def _place_in_own_file(self, array: np.ndarray) -> tuple[Any, ...] | None:
        nbytes = array.nbytes
        if not self._wait_for_space(0, extra=nbytes):
            return None
        try:
            path, fd = allocate_shared_file(nbytes, "trainguard-tensor-")
        except OSError:  # shared memory full: down the pipe instead, slower but nothing lost
            return ("inline", array, nbytes)
        try:
            with mmap.mmap(fd, nbytes) as target:
                target[:] = array.reshape(-1).view(np.uint8).data
        finally:
            os.close(fd)
        self._segment_bytes_sent += nbytes
        return ("file", path, nbytes, array.dtype.str, array.shape)

    def _tail(self) -> int:
        """Where the ring's used part begins (the process's releases, or a fresh start)."""
        return max(int(self._slots[SLOT_TAIL]), self._free_through)

    def _pending(self) -> int:
        in_ring = self._head - self._tail()
        in_files = self._segment_bytes_sent - int(self._slots[SLOT_SEGMENT_BYTES_DONE])
        return in_ring + in_files

    def _wait_for_space(self, ring_bytes: int, *, extra: int = 0) -> bool:
        """Wait until the ring has ``ring_bytes`` free and all pending data, plus ``extra``,
        fits the budget; False (capture disabled) if the writer fails or stalls meanwhile."""

        def fits() -> bool:
            in_ring = self._head - self._tail()
            if ring_bytes and in_ring + ring_bytes > self._ring_size:
                return False
            pending = self._pending()
            return pending == 0 or pending + ring_bytes + extra <= self.max_pending_bytes

        if fits():
            return True
        self._send_batch()  # the process frees only what it has been told about
        started = time.monotonic()
        deadline = started + self.max_block_seconds
        pause = 0.0002
        try:
            while not fits():
                if not self._usable() or self._check_process() is not None:
                    return False
                if time.monotonic() >= deadline:
                    self._fail(TimeoutError(f"writer process for {self.store.url} made no progress "
                                            f"for {self.max_block_seconds:.0f} s"))  # fmt: skip
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
            return True
        finally:
            self.blocked_seconds += time.monotonic() - started

    def _send_batch(self) -> None:
        if not self._batch or self.failure is not None:
            self._batch.clear()
            return
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        self._frames_sent += 1
        payload = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        frame = memoryview(FRAME_HEAD.pack(len(payload), self._frames_sent) + payload)
        deadline = time.monotonic() + self.max_block_seconds
        while frame:
            try:
                written = os.write(self._pipe, frame)
            except BlockingIOError:
                # The process is behind by a pipe's worth of messages: wait for it, not forever.
                waited = time.monotonic()
                remaining = deadline - waited
                if remaining <= 0 or self._check_process() is not None:
                    if self.failure is None:
                        self._fail(TimeoutError(f"writer process for {self.store.url} took no message "
                                                f"for {self.max_block_seconds:.0f} s"))  # fmt: skip
                    return
                select.select([], [self._pipe], [], min(remaining, 0.5))
                self.blocked_seconds += time.monotonic() - waited
                continue
            except OSError as error:  # EPIPE: the process is gone
                self._check_process()
                if self.failure is None:
                    self._fail(RuntimeError(f"the writer process stopped reading: {error}"))
                return
            frame = frame[written:]

    def _check_process(self) -> BaseException | None:
        """The failure, if the writer process failed or exited; capture is disabled then."""
        if self.failure is not None:
            return self.failure
        if self._slots[SLOT_FAILED]:
            step = int(self._slots[SLOT_FAILED_STEP]) - 1
            message = f"writer process failed: {read_error(self._map)}"
            self._fail(WriterProcessError(message, step if step >= 0 else None))
        elif self._process.poll() is not None and not self._closed:
            self._fail(RuntimeError(f"writer process exited with code {self._process.returncode}"))
        elif not self._slots[SLOT_READY] and time.monotonic() - self._started > self.START_SECONDS:
            self._fail(TimeoutError(f"writer process did not start within {self.START_SECONDS:.0f} s"))
        return self.failure

    def _fail(self, error: BaseException) -> None:
        super()._fail(error)
        self._batch.clear()

    def _close_pipe(self) -> None:
        self._pipe = close_quietly(self._pipe)

    def _discard_shared_memory(self) -> None:
        unlink_quietly(self._shm_path)  # the process unlinks it too; whoever comes first
        # Unmap the ring (its memory stays allocated while mapped); the counters stay readable.
        self._slots = self._slots.copy()
        self._ring = np.empty(0, dtype=np.uint8)
        try:
            self._map.close()
        except BufferError:  # a view of it is still alive somewhere: the GC unmaps it later
            pass

    def _after_fork_in_child(self) -> None:
        self._lock = threading.RLock()  # another thread may have held it at fork time
        # A forked DataLoader worker must not keep the pipe open: the writer process would
        # never see end-of-file when the training process ends.
        self._close_pipe()
        super()._after_fork_in_child()
