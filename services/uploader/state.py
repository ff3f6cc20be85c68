"""The uploader's progress: which local files are on S3, as of which size and mtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["UploadState"]

_VERSION = 1


class UploadState:
    """``{relative key: [size, mtime_ns]}`` for every uploaded file, persisted atomically.

    Each :meth:`record` rewrites the whole file through a temp file and ``os.replace``: a reader
    (or a restarted uploader after kill -9) sees the old state or the new one, never half of one.
    A file rewritten in place (the collections file) differs in size or mtime and goes up again.
    """

    def __init__(self, path: Path, destination: str) -> None:
        self.path = path
        self.destination = destination
        self._uploaded: dict[str, tuple[int, int]] = {}
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
        self._save()

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
