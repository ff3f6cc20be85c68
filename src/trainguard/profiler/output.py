"""Writing profiler files so that a reader never sees half a record.

Two destinations:

* a local directory: system-metric lines are appended to the minute file with one ``write``
  call per sample (complete lines only; readers consume a file only up to its last newline),
  and whole files (framework timelines) are written to a hidden temp name and renamed;
* any other :class:`~trainguard.storage.Store` (``s3://``, ``memory://``): objects cannot be
  appended to, so the current minute file is kept in memory and the whole object is rewritten
  (one atomic PUT) every ``flush_interval_s`` seconds and when the minute is over. Each rewrite
  holds a superset of the previous one, so a reader that remembers how many bytes it consumed
  can go on from there.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainguard.profiler.layout import PROFILER_DIR, system_key
from trainguard.storage import is_remote, open_store
from trainguard.storage.base import Store

__all__ = ["ProfilerOutput", "SystemMetricsWriter", "open_output"]


class ProfilerOutput:
    """Destination of one profiler's files. Keys are relative to ``profiler-output/``."""

    url: str

    def append_lines(self, key: str, data: bytes) -> None:
        """Append complete JSON lines (``data`` ends with a newline) to ``key``."""
        raise NotImplementedError

    def end_file(self, key: str) -> None:
        """No more lines will be appended to ``key``."""

    def write_file(self, key: str, data: bytes) -> None:
        """Write a whole object atomically."""
        raise NotImplementedError

    def flush(self, force: bool = False) -> None:
        """Make appended lines visible to readers (a no-op where they already are)."""

    def close(self) -> None:
        self.flush(force=True)


class LocalOutput(ProfilerOutput):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        self._fds: dict[str, int] = {}

    def _path(self, key: str) -> Path:
        return self.root / key

    def append_lines(self, key: str, data: bytes) -> None:
        fd = self._fds.get(key)
        if fd is None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._fds[key] = fd
        os.write(fd, data)

    def end_file(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    def write_file(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)

    def close(self) -> None:
        for key in list(self._fds):
            self.end_file(key)


class StoreOutput(ProfilerOutput):
    """Rewrites whole objects in a store; thread-safe (lines come from the sampler thread,
    timelines from the training thread's rotation)."""

    def __init__(self, store: Store, prefix: str, flush_interval_s: float = 10.0) -> None:
        self.store = store
        self.prefix = prefix
        self.url = f"{store.url.rstrip('/')}/{prefix.rstrip('/')}"
        self.flush_interval_s = flush_interval_s
        self._buffers: dict[str, bytearray] = {}
        self._dirty: set[str] = set()
        self._ended: set[str] = set()
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()

    def append_lines(self, key: str, data: bytes) -> None:
        with self._lock:
            self._buffers.setdefault(key, bytearray()).extend(data)
            self._dirty.add(key)

    def end_file(self, key: str) -> None:
        with self._lock:
            self._ended.add(key)

    def write_file(self, key: str, data: bytes) -> None:
        self.store.write(self.prefix + key, data)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            ended = [key for key in self._ended if key in self._buffers]
            due = force or now - self._last_flush >= self.flush_interval_s
            keys = sorted(self._dirty if due else self._dirty.intersection(ended))
            snapshot = {key: bytes(self._buffers[key]) for key in keys}
            self._dirty.difference_update(keys)
            for key in ended:
                if key not in self._dirty:
                    self._buffers.pop(key, None)
                    self._ended.discard(key)
            if due:
                self._last_flush = now
        for key, data in snapshot.items():
            self.store.write(self.prefix + key, data)


def open_output(
    out_dir: str | os.PathLike[str] | Store, flush_interval_s: float = 10.0, **store_options: Any
) -> ProfilerOutput:
    """The output for a run: ``out_dir`` is the run directory (the hook's ``out_dir``), an
    ``s3://``/``memory://`` URL, or a Store; files go under its ``profiler-output/``."""
    if not isinstance(out_dir, (str, os.PathLike)):
        return StoreOutput(out_dir, PROFILER_DIR + "/", flush_interval_s)
    text = os.fspath(out_dir)
    if is_remote(text) or text.startswith("memory://"):
        return StoreOutput(open_store(text, **store_options), PROFILER_DIR + "/", flush_interval_s)
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalOutput(Path(text) / PROFILER_DIR)


class SystemMetricsWriter:
    """Turns samples into SageMaker's JSON lines, one file per node and minute."""

    def __init__(self, output: ProfilerOutput, node: str) -> None:
        self.output = output
        self.node = node
        self._key: str | None = None
        self._minute = -1

    def write_sample(self, timestamp: float, metrics: Iterable[tuple[str, str, str, float]]) -> None:
        """One sample: ``(Type, Name, Dimension, Value)`` tuples, all stamped ``timestamp``."""
        minute = int(timestamp // 60) * 60
        if minute != self._minute:
            if self._key is not None:
                self.output.end_file(self._key)
            self._minute = minute
            self._key = system_key(minute, self.node)
        stamp = round(timestamp, 3)
        lines = [
            json.dumps(
                {"Type": kind, "Name": name, "Dimension": dimension, "Value": round(float(value), 4),
                 "NodeId": self.node, "Timestamp": stamp},
                separators=(", ", ": "),
            )
            for kind, name, dimension, value in metrics
        ]  # fmt: skip
        if lines and self._key is not None:
            self.output.append_lines(self._key, ("\n".join(lines) + "\n").encode())

    def close(self) -> None:
        if self._key is not None:
            self.output.end_file(self._key)
            self._key = None
