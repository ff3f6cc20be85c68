"""Framework timeline files in SageMaker's Chrome-trace layout.

A file is a JSON array (open it in chrome://tracing or Perfetto). Its first event is metadata::

    {"name": "process_name", "ph": "M", "pid": 0,
     "args": {"start_time_since_epoch_in_micros": <file start, µs>, "name": "trainguard",
              "rank": <rank>, "host": <host>, "cpu_count": <cores>}}

then one ``process_name`` metadata event per phase (``pid`` 1, 2, ... naming e.g.
``Step:ModeKeys.TRAIN``) and complete events ``{"name", "ph": "X", "ts", "dur", "pid", "tid",
"args"}`` with ``ts`` in µs relative to the file start. Files are closed and made visible under
``framework/pevents/<YYYYMMDDHH>/<end_us>_<rank>-<host>_pythontimeline.json`` when they reach
``rotate_max_bytes`` or ``rotate_interval_s``; until then events stay in memory, so the training
thread never does file I/O (the profiler's background thread calls :meth:`maybe_rotate`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from trainguard.profiler.layout import framework_key

__all__ = ["TimelineWriter"]

_ESTIMATED_EVENT_BYTES = 160  # for the size-based rotation without serialising every event


class TimelineWriter:
    """Collects complete events; ``sink(key, data)`` receives each closed file."""

    def __init__(
        self,
        sink: Callable[[str, bytes], None],
        rank: int,
        host: str,
        *,
        rotate_max_bytes: int = 10 * 1024 * 1024,
        rotate_interval_s: float = 60.0,
    ) -> None:
        self.sink = sink
        self.rank = rank
        self.host = host
        self.rotate_max_bytes = rotate_max_bytes
        self.rotate_interval_s = rotate_interval_s
        self._events: list[tuple[str, str, float, float, int, dict[str, Any]]] = []
        self._opened = time.time()
        self._lock = threading.Lock()
        self._last_end_us = 0

    def record(self, name: str, phase: str, start_s: float, end_s: float, args: dict[str, Any]) -> None:
        """One complete event (epoch seconds). Called on the training thread: no I/O here."""
        event = (name, phase, start_s, end_s, threading.get_ident(), args)
        with self._lock:
            self._events.append(event)

    def maybe_rotate(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            full = len(self._events) * _ESTIMATED_EVENT_BYTES >= self.rotate_max_bytes
            if not full and now - self._opened < self.rotate_interval_s:
                return
        self.rotate(now)

    def rotate(self, now: float | None = None) -> None:
        """Close the current file (if it has events) and start a new one."""
        now = time.time() if now is None else now
        with self._lock:
            events, self._events = self._events, []
            opened, self._opened = self._opened, now
        if not events:
            return
        end_us = max(int(now * 1e6), self._last_end_us + 1)
        self._last_end_us = end_us
        self.sink(framework_key(end_us, self.rank, self.host), self._serialise(events, opened))

    def _serialise(self, events: list[tuple[str, str, float, float, int, dict[str, Any]]], opened: float) -> bytes:
        start_us = int(min(opened, min(event[2] for event in events)) * 1e6)
        pids: dict[str, int] = {}
        lines = [
            json.dumps(
                {"name": "process_name", "ph": "M", "pid": 0,
                 "args": {"start_time_since_epoch_in_micros": start_us, "name": "trainguard",
                          "rank": self.rank, "host": self.host, "cpu_count": os.cpu_count() or 1}}
            )
        ]  # fmt: skip
        for name, phase, start_s, end_s, tid, args in events:
            pid = pids.get(phase)
            if pid is None:
                pid = pids[phase] = len(pids) + 1
                lines.append(json.dumps({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": phase}}))
            ts = int(start_s * 1e6) - start_us
            dur = max(0, int(end_s * 1e6) - int(start_s * 1e6))
            lines.append(
                json.dumps({"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args})
            )
        return ("[\n" + ",\n".join(lines) + "\n]\n").encode()
