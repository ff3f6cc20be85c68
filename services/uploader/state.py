"""The uploader's progress: which local files are on S3, as of which size and mtime."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

__all__ = ["UploadState"]

_VERSION = 1
log = logging.getLogger("trainguard.uploader")


class UploadState:
    """``{relative key: [size, mtime_ns]}`` for every uploaded file, persisted atomically.

    :meth:`flush` rewrites the whole file through a temp file and ``os.replace``: a restarted
    uploader (even after kill -9) sees the old state or the new one, never half of one. The uploader
    flushes after each round and at least every ``flush_interval_s`` during a long one, so the cost
    stays linear in the run's size; what a kill loses since the last flush is found on S3 again by
    the uploader's HEAD check, not uploaded twice. A file rewritten in place (the collections file)
    differs in size or mtime and goes up again.
    """

    def __init__(self, path: Path, destination: str, flush_interval_s: float = 1.0) -> None:
        self.path = path
        self.destination = destination
        self.flush_interval_s = flush_interval_s
        self._uploaded: dict[str, tuple[int, int]] = {}
        self._dirty = False
        self._save_failed = False
        self._last_flush = time.monotonic()
        self._load()

    def _load(self) -> None:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            # A state file we cannot read costs re-uploads (with a HEAD check first), never a lost file.
            return
        if document.get("version") != _VERSION or document.get("destination") != self.destination:
            return  # progress towards another destination says nothing about this one
        self._uploaded = {key: (int(v[0]), int(v[1])) for key, v in document.get("uploaded", {}).items()}

    def is_current(self, key: str, size: int, mtime_ns: int) -> bool:
        return self._uploaded.get(key) == (size, mtime_ns)

    def __contains__(self, key: str) -> bool:
        return key in self._uploaded

    def __len__(self) -> int:
        return len(self._uploaded)

    def record(self, key: str, size: int, mtime_ns: int) -> None:
        self._uploaded[key] = (size, mtime_ns)
        self._dirty = True
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def size_of(self, key: str) -> int | None:
        value = self._uploaded.get(key)
        return value[0] if value else None

    def keys(self) -> list[str]:
        return list(self._uploaded)

    def forget(self, key: str) -> None:
        """``key`` is not (or no longer) on S3: the next round uploads it again."""
        if self._uploaded.pop(key, None) is not None:
            self._dirty = True

    def flush(self) -> None:
        if not self._dirty:
            return
        self._last_flush = time.monotonic()
        try:
            self._save()
        except OSError as error:
            # The state lives beside the run, on the training's disk; when that disk is full the
            # uploader must go on uploading (the run's files are already there), not die. The state
            # only saves a restarted uploader work: without it, the restart checks S3 first.
            if not self._save_failed:
                log.warning("cannot save the upload state %s (%s); uploading goes on, kept in memory", self.path, error)
            self._save_failed = True
            try:
                self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp").unlink(missing_ok=True)
            except OSError:
                pass
            return
        self._save_failed = False
        self._dirty = False

    def _save(self) -> None:
        document = {
            "version": _VERSION,
            "destination": self.destination,
            "uploaded": {key: list(value) for key, value in self._uploaded.items()},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(document, separators=(",", ":")))
        os.replace(temp, self.path)
