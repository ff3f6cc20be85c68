"""An in-process store: a public test double and a scratch space for notebooks."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from trainguard.errors import ObjectNotFound
from trainguard.storage.base import Buffer

__all__ = ["MemoryStore"]

# memory://<name> URLs open the same store from anywhere in the process.
_NAMED: dict[str, MemoryStore] = {}
_NAMED_LOCK = threading.Lock()


class _MemoryWriter:
    def __init__(self, store: MemoryStore, key: str) -> None:
        self._store = store
        self._key = key
        self._parts: list[bytes] = []

    def write(self, data: Buffer) -> None:
        self._parts.append(bytes(data))

    def commit(self) -> None:
        self._store._put(self._key, b"".join(self._parts))

    def abort(self) -> None:
        self._parts.clear()


class MemoryStore:
    """Objects in a dict. Thread-safe; keys kept sorted for listing."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._objects: dict[str, bytes] = {}
        self._sorted_keys: list[str] = []
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        with _NAMED_LOCK:
            if name not in _NAMED:
                _NAMED[name] = cls(name)
            return _NAMED[name]

    @property
    def url(self) -> str:
        return f"memory://{self.name}"

    def __repr__(self) -> str:
        return f"MemoryStore({self.name!r})"

    def _put(self, key: str, data: bytes) -> None:
        with self._lock:
            if key not in self._objects:
                bisect.insort(self._sorted_keys, key)
            self._objects[key] = data

    def open_writer(self, key: str) -> _MemoryWriter:
        return _MemoryWriter(self, key)

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
        self._put(key, b"".join(bytes(part) for part in parts))

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        with self._lock:
            try:
                data = self._objects[key]
            except KeyError:
                raise ObjectNotFound(f"{self.url}/{key} does not exist") from None
        return data[start:] if length is None else data[start : start + length]

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._objects

    def size(self, key: str) -> int:
        return len(self.read(key))

    def delete(self, key: str) -> None:
        with self._lock:
            if self._objects.pop(key, None) is not None:
                self._sorted_keys.remove(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        with self._lock:
            keys = self._sorted_keys
            position = bisect.bisect_left(keys, prefix)
            if start_after is not None:
                position = max(position, bisect.bisect_right(keys, start_after))
            out = []
            for key in keys[position:]:
                if not key.startswith(prefix):
                    break
                out.append(key)
            return out
