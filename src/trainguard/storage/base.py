"""The one storage seam: every read and write of a run goes through a :class:`Store`.

Keys are relative to the run root and always use ``/``. Two guarantees every store gives:

* **Atomic objects.** A key becomes visible only when its writer commits, whole; a reader never
  sees half an object. (Local: write to a hidden temp file, then rename. S3: one PUT.)
* **Sorted, incremental listing.** ``list(prefix, start_after=k)`` returns keys after ``k`` in
  byte order, so a reader following a live run asks only for what is new.

Runs are written once and never modified, which is what makes caching reads safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Buffer", "Store", "StoreWriter"]

Buffer = bytes | bytearray | memoryview


@runtime_checkable
class StoreWriter(Protocol):
    """An object being written. Nothing is visible until :meth:`commit`."""

    def write(self, data: Buffer) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


@runtime_checkable
class Store(Protocol):
    """A place holding one run's objects: a local directory, an S3 prefix, or memory."""

    @property
    def url(self) -> str: ...

    def open_writer(self, key: str) -> StoreWriter: ...

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        """Write a whole object atomically."""
        ...

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Read an object, or ``length`` bytes of it from ``start``. Raises ObjectNotFound."""
        ...

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Keys under ``prefix`` sorted, strictly after ``start_after`` when given."""
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Size of an object in bytes. Raises ObjectNotFound."""
        ...

    def delete(self, key: str) -> None: ...
