"""Starting the writer process (child.py) and its shared-memory ring, possibly before the
worker it writes for is known.

A writer process's start (an interpreter, numpy, protobuf: a fraction of a second of CPU) would
otherwise begin at the first saved step, usually the first step of training, and with the other
cores busy (data-loader workers) take that CPU from training's own core: stalls across the first
hundreds of steps. A hook that will most likely write from a process starts it as the hook is
created instead (``trainguard run``: when the script imports
torch, seconds before its first step); the first save adopts it and names its worker then, since
a distributed rank is known only once the script has set up its process group.
"""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import weakref

from trainguard.errors import TrainguardError
from trainguard.writer.ring import HEADER_BYTES, UNNAMED_IDLE_SECONDS

__all__ = [
    "WriterChild",
    "WriterUnavailable",
    "allocate_shared_file",
    "close_quietly",
    "in_multiprocessing_child",
    "shared_memory_dir",
    "unlink_quietly",
]

logger = logging.getLogger("trainguard")



class WriterUnavailable(TrainguardError):
    """The writer process cannot be used here (no shared memory, a store it cannot open)."""


def shared_memory_dir() -> str:
    """/dev/shm where it is a writable directory (RAM), else the temporary directory."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def allocate_shared_file(size: int, prefix: str) -> tuple[str, int]:
    """A new file of ``size`` bytes, every block allocated (a full tmpfs fails here, not later
    with a SIGBUS on first touch). Returns its path and an open descriptor."""
    fd, path = tempfile.mkstemp(prefix=prefix, dir=shared_memory_dir())
    try:
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        unlink_quietly(path)
        raise
    return path, fd


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def close_quietly(fd: int) -> int:
    """Close ``fd`` if it is one (>= 0), ignoring errors; returns -1, the "closed" value."""
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
    return -1


def in_multiprocessing_child() -> bool:
    """Whether this process is a ``multiprocessing`` child being set up or running (a spawned
    DataLoader worker imports torch too, and never writes)."""
    if "--multiprocessing-fork" in sys.argv:
        return True
    try:
        return multiprocessing.parent_process() is not None or bool(
            getattr(multiprocessing.current_process(), "_inheriting", False)
        )
    except Exception:  # noqa: BLE001 - a guess only: when unsure, start nothing ahead
        return True


def _child_environment() -> dict[str, str]:
    environment = dict(os.environ)
    # The writer process must not arm the zero-code hook or a profiler of its own, and must keep
    # to one core: numpy's BLAS would otherwise start a thread per core.
    environment["TRAINGUARD_ZERO_CODE"] = "0"
    environment.pop("TRAINGUARD_PROFILER", None)
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        environment[variable] = "1"
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    existing = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, existing) if p)
    return environment


class WriterChild:
    """A writer process, its ring (mapped here) and the pipe to it. ``worker`` None: started
    ahead, unnamed; :class:`ProcessStepWriter` names it when it adopts it, and takes over the
    pipe, the map and the process (this object then owns nothing)."""

    idle_seconds = UNNAMED_IDLE_SECONDS  # how long an unnamed process waits for its name

    def __init__(self, root: str, ring_size: int, nice: int, worker: str | None) -> None:
        self.root = root
        self.ring_size = ring_size
        self.named = worker is not None
        self._forked = False
        try:
            self.shm_path, fd = allocate_shared_file(HEADER_BYTES + ring_size, "trainguard-ring-")
        except OSError as error:
            raise WriterUnavailable(f"no shared memory for the writer process: {error}") from error
        try:
            self.map = mmap.mmap(fd, HEADER_BYTES + ring_size)
        finally:
            os.close(fd)
        read_end, self.pipe = os.pipe()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trainguard.writer.child",
                    root,
                    worker if worker is not None else "",
                    self.shm_path,
                    str(ring_size),
                    str(read_end),
                    str(nice),
                    str(self.idle_seconds),
                ],  # fmt: skip
                pass_fds=(read_end,),
                env=_child_environment(),
                stdin=subprocess.DEVNULL,
            )
        except OSError as error:
            os.close(self.pipe)
            self.pipe = -1
            self._release_memory()
            raise WriterUnavailable(f"cannot start the writer process: {error}") from error
        finally:
            os.close(read_end)
        os.set_blocking(self.pipe, False)
        self.started = time.monotonic()
        reference = weakref.ref(self)

        def _in_child() -> None:
            child = reference()
            if child is not None:
                child._after_fork_in_child()

        os.register_at_fork(after_in_child=_in_child)

    def adoptable(self, root: str, ring_size: int) -> bool:
        """Whether a writer for ``root`` with this ring may take this process over: it is ours
        (not a fork's copy), still running, and far from giving up on being named."""
        return (
            not self._forked
            and self.pipe >= 0
            and self.root == root
            and self.ring_size == ring_size
            and time.monotonic() - self.started < 0.9 * self.idle_seconds
            and self.process.poll() is None
        )

    def hand_over(self) -> None:
        """The adopting writer owns the pipe, the map and the process from now on."""
        self.pipe = -1

    def discard(self) -> None:
        """Stop an unadopted process: it reads end-of-file and exits (it was told nothing to
        write). In a forked copy only this process's descriptors go: the writer is the parent's."""
        if self.pipe < 0 and not self._forked:
            return  # adopted (or discarded): nothing here is ours any more
        self._close_pipe()
        if self._forked:
            return
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._release_memory()

    def _release_memory(self) -> None:
        unlink_quietly(self.shm_path)  # the process unlinks it once mapped; whoever comes first
        try:
            self.map.close()
        except BufferError:  # a view of it is still alive somewhere: the GC unmaps it later
            pass

    def _after_fork_in_child(self) -> None:
        # A forked DataLoader worker must not keep the pipe open: the writer process would
        # never see end-of-file when the training process ends.
        self._forked = True
        self._close_pipe()

    def _close_pipe(self) -> None:
        self.pipe = close_quietly(self.pipe)

