"""The writer process: ``python -m trainguard.writer.child ROOT WORKER RING SIZE FD NICE [IDLE]``.

Started by spawn.WriterChild for process.ProcessStepWriter; an empty WORKER: started ahead of the
first save, it waits for its worker's name (the first message), and exits if none comes within
ring.UNNAMED_IDLE_SECONDS. It reads messages from the pipe ``FD``, tensors from the shared-memory
ring ``RING`` (its layout: ring.py) and writes steps to the local directory ``ROOT`` with
step_file.py. It imports nothing of the training side's writer (process.py, spawn.py).
It imports no framework: CPU reductions are computed here with numpy (float64, as the reader's
reference definitions). After a failure it records the reason in the ring's header and keeps
releasing ring space (so training never waits on it) until the pipe closes.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import sys
import traceback
from typing import Any

import numpy as np

from trainguard.errors import StorageError
from trainguard.priority import yield_to_training
from trainguard.reductions import reduce_array
from trainguard.storage.local import LocalStore
from trainguard.writer.ring import (
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
    UNNAMED_IDLE_SECONDS,
    write_error,
)
from trainguard.writer.step_file import StepFile

__all__ = ["WriterProcess", "main"]


class _Stop(Exception):
    pass


class WriterProcess:
    def __init__(self, root: str, worker: str, ring_path: str, ring_size: int) -> None:
        fd = os.open(ring_path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, HEADER_BYTES + ring_size)
        finally:
            os.close(fd)
        try:
            os.unlink(ring_path)  # mapped by both processes now: nothing to clean up after a crash
        except OSError:
            pass
        self.slots = np.frombuffer(self._map, dtype=np.uint64, count=SLOTS)
        self.ring = np.frombuffer(self._map, dtype=np.uint8, offset=HEADER_BYTES)
        self.root = root
        # None until named (a process started ahead); every message but "worker" comes after
        self.step_file: StepFile | None = StepFile(LocalStore(root), worker) if worker else None
        self.reductions: list[tuple[list[str], np.ndarray]] = []
        self.failed = False

    # -- tensors ----------------------------------------------------------------------------
    def _array(self, placed: tuple[Any, ...]) -> np.ndarray:
        """The array a placement names (release it with :meth:`_release` once written)."""
        where = placed[0]
        if where == "ring":
            _, start, nbytes, dtype, shape, _ = placed
            return self.ring[start : start + nbytes].view(np.dtype(dtype)).reshape(shape)
        if where == "file":
            _, path, nbytes, dtype, shape = placed
            fd = os.open(path, os.O_RDONLY)
            try:
                segment = mmap.mmap(fd, nbytes, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
                os.unlink(path)
            return np.frombuffer(segment, dtype=np.dtype(dtype)).reshape(shape)
        return placed[1]

    def _release(self, placed: tuple[Any, ...]) -> None:
        """Give a placement's shared memory back (in order, for the ring)."""
        if placed[0] == "ring":
            self.slots[SLOT_TAIL] = placed[5]
        elif placed[0] == "file":
            self.slots[SLOT_SEGMENT_BYTES_DONE] += np.uint64(placed[2])

    def _discard(self, item: tuple[Any, ...]) -> None:
        """After a failure: give the item's memory back without writing it."""
        placed = item[2] if item[0] == "tensor" else item[3] if item[0] == "reduce" else None
        if placed is None:
            return
        if placed[0] == "file":
            try:
                os.unlink(placed[1])
            except OSError:
                pass
        self._release(placed)

    # -- messages ---------------------------------------------------------------------------
    @property
    def _file(self) -> StepFile:
        if self.step_file is None:
            raise RuntimeError("a writer message came before the worker's name")
        return self.step_file

    def handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "worker":
            self.step_file = StepFile(LocalStore(self.root), item[1])
        elif kind == "begin":
            if self._file.open:
                self._finish_step()
            self._file.begin(item[1], item[2], item[3])
        elif kind == "tensor":
            _, name, placed, proto_dtype = item
            array = self._array(placed)
            try:
                if self._file.open:
                    self._file.tensor(name, array, proto_dtype)
            finally:
                del array
                self._release(placed)
        elif kind == "reduce":
            _, names, requested, placed = item
            array = self._array(placed)
            try:
                if self._file.open:
                    self.reductions.append((names, _reductions(array, requested)))
            finally:
                del array
                self._release(placed)
        elif kind == "scalars":
            if self._file.open:
                self.reductions.append((item[1], np.asarray(item[2], dtype=np.float64)))
        elif kind == "end":
            self._finish_step()
        elif kind == "abort":
            self.reductions.clear()
            self._file.abort()
        elif kind == "object":
            self._file.store.write(item[1], item[2])
        elif kind == "stop":
            raise _Stop
        else:
            raise AssertionError(f"unknown writer message {kind!r}")

    def _finish_step(self) -> None:
        if self.reductions and self._file.open:
            names = [name for group, _ in self.reductions for name in group]
            values = np.concatenate([values.reshape(-1) for _, values in self.reductions])
            self._file.scalars(names, values)
        self.reductions.clear()
        self._file.end()
        self.slots[SLOT_BYTES_WRITTEN] = self._file.bytes_written
        self.slots[SLOT_STEPS_WRITTEN] = self._file.steps_written

    def fail(self, error: BaseException) -> None:
        self.failed = True
        if self.step_file is not None:
            if self.step_file.step is not None:
                self.slots[SLOT_FAILED_STEP] = self.step_file.step + 1
            self.step_file.abort_quietly()
        self.reductions.clear()
        write_error(self._map, f"{type(error).__name__}: {error}")
        self.slots[SLOT_FAILED] = 1
        # The training process logs the one line that says what happened (the reason above); a
        # store that refuses writes (disk full, read-only) is no bug, so no traceback for it.
        if not isinstance(error, StorageError):
            traceback.print_exception(error, file=sys.stderr)

    def run(self, fd: int, idle_seconds: float = UNNAMED_IDLE_SECONDS) -> None:
        self.slots[SLOT_READY] = 1
        if self.step_file is None and not wait_to_be_named(fd, idle_seconds):
            return  # started ahead, and no hook adopted it
        buffer = bytearray()
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:  # the training process died: every step it ended is written by now;
                if self.step_file is not None:  # one it left open is dropped, as in-process
                    self.step_file.abort_quietly()
                return
            buffer += chunk
            while len(buffer) >= FRAME_HEAD.size:
                length, number = FRAME_HEAD.unpack_from(buffer)
                if len(buffer) < FRAME_HEAD.size + length:
                    break
                batch = pickle.loads(memoryview(buffer)[FRAME_HEAD.size : FRAME_HEAD.size + length])
                del buffer[: FRAME_HEAD.size + length]
                for item in batch:
                    if self.failed:
                        self._discard(item)
                        continue
                    try:
                        self.handle(item)
                    except _Stop:
                        self.slots[SLOT_FRAMES_DONE] = number
                        return
                    except BaseException as error:  # noqa: BLE001 - reported to the training process
                        self.fail(error)
                        self._discard(item)
                self.slots[SLOT_FRAMES_DONE] = number


def wait_to_be_named(fd: int, seconds: float) -> bool:
    """In an unnamed writer process: whether the pipe has something to read (its name, or
    end-of-file) within ``seconds``; False: no hook adopted it, it exits."""
    readable, _, _ = select.select([fd], [], [], seconds)
    return bool(readable)


def _reductions(array: np.ndarray, requested: tuple[tuple[str, bool], ...]) -> np.ndarray:
    """numpy's reductions in float64, but ``prod`` in the tensor's own float type, as the thread
    writer's torch kernels (and smdebug) compute it: a float32 product underflows to 0 there."""
    values = reduce_array(array, requested)
    if array.dtype in (np.float16, np.float32) and array.size:
        for position, (name, use_abs) in enumerate(requested):
            if name == "prod":
                source = np.abs(array) if use_abs else array
                values[position] = np.prod(source, dtype=np.float32)
    return values


def main(argv: list[str]) -> int:
    # A Ctrl-C or a stop reaches the whole process group; this process ends when the training
    # process closes the pipe (after its own handlers ran), so that nothing handed over is lost.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    root, worker, ring_path, ring_size, fd, nice, *idle = argv
    # Background work: on a saturated machine training and the rule runners come first. A writer
    # at training's own priority starves the rule runner, so a rule that should stop a diverging
    # job stops it thousands of steps late; niced, it stops it about as early as the thread writer
    # does. The ring's backpressure keeps capture at most a ring behind training.
    yield_to_training(int(nice))
    process = WriterProcess(root, worker, ring_path, int(ring_size))
    process.run(int(fd), float(idle[0]) if idle else UNNAMED_IDLE_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
