"""A read-through local-disk cache in front of a remote store, and batched range reads.

Runs are written once: an object that can be read never changes afterwards, so whatever was
fetched (index files, event files, slices of them) can be kept on disk forever and served from
there. Listings are never cached: a live run keeps growing, and ``list`` is how readers see it.

Each cached file starts with a small header holding the object's length and CRC32, so a file
cut short (a crash, a full disk, a copy gone wrong) is detected and fetched again. Files are
written to a temp name and renamed into place, so no reader ever sees half of one.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from trainguard.storage.base import Buffer, Store, StoreWriter

__all__ = ["CachingStore", "default_cache_dir", "read_ranges"]

logger = logging.getLogger("trainguard")

# read_ranges fetches the whole object in one request rather than range by range when there
# are more than this many ranges, or when they add up to more than this fraction of the object:
# past that point one GET costs less than the round trips.
MAX_SEPARATE_RANGES = 4
WHOLE_OBJECT_FRACTION = 0.25
# Ranged GETs of one read_ranges call run concurrently on at most this many threads.
RANGE_THREADS = 4

_HEADER = struct.Struct("<4sQI")  # magic, length of the data that follows, CRC32 of it
_MAGIC = b"TGC1"


def default_cache_dir() -> Path:
    """``$TRAINGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainguard``, else ``~/.cache/trainguard``."""
    configured = os.environ.get("TRAINGUARD_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trainguard"


def _wants_whole(ranges: Sequence[tuple[int, int]], size: int | None) -> bool:
    if len(ranges) > MAX_SEPARATE_RANGES:
        return True
    return size is not None and sum(length for _, length in ranges) > WHOLE_OBJECT_FRACTION * size


def read_ranges(store: Store, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """Read ``(start, length)`` slices of one object, in the order given, from any store.

    Uses the store's own ``read_ranges`` when it has one (:class:`CachingStore`); otherwise reads
    the whole object once when many ranges are asked for, else each range on its own.
    """
    method = getattr(store, "read_ranges", None)
    if method is not None:
        return list(method(key, ranges))
    ranges = list(ranges)
    if not ranges:
        return []
    size = None if len(ranges) > MAX_SEPARATE_RANGES else store.size(key)
    if _wants_whole(ranges, size):
        data = store.read(key)
        return [data[start : start + length] for start, length in ranges]
    return [store.read(key, start, length) for start, length in ranges]


class CachingStore:
    """``inner`` with reads cached under ``cache_dir`` (default :func:`default_cache_dir`).

    Each inner store gets its own folder, named by a hash of its URL, so one cache directory
    serves any number of runs. Writes and deletes go straight to ``inner``; the cache only
    fills on reads and is never evicted: delete the folder to reclaim the space.

    ``uncached_prefixes`` names keys that are rewritten during a run and so must always be
    read from ``inner`` (the one exception to write-once is for the caller to know, not the store).
    """

    def __init__(
        self,
        inner: Store,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        uncached_prefixes: Sequence[str] = (),
    ) -> None:
        self.inner = inner
        self.uncached_prefixes = tuple(uncached_prefixes)
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.directory = root / hashlib.sha256(inner.url.encode()).hexdigest()[:24]
        self._sizes: dict[str, int] = {}
        self._sizes_lock = threading.Lock()
        self._labelled = False

    @property
    def url(self) -> str:
        return self.inner.url

    def __repr__(self) -> str:
        return f"CachingStore({self.inner!r}, {str(self.directory)!r})"

    # -- writes pass through ------------------------------------------------------------------

    def open_writer(self, key: str) -> StoreWriter:
        return self.inner.open_writer(key)

    def write(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        self.inner.write(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        with self._sizes_lock:
            self._sizes.pop(key, None)
        whole = self._path(key, ".obj")
        for path in whole.parent.glob(f"{whole.stem}.*"):
            self._discard(path)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        return self.inner.list(prefix, start_after)

    # -- reads ----------------------------------------------------------------------------------

    def read(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if key.startswith(self.uncached_prefixes):
            return self.inner.read(key, start, length)
        data = self._load(self._path(key, ".obj"), start, length)
        if data is not None:
            return data
        if start == 0 and length is None:
            return self._fetch_whole(key)
        if length is not None and length <= 0:
            return self.inner.read(key, start, length)
        path = self._path(key, f".{start}-{'end' if length is None else length}.rng")
        data = self._load(path)
        if data is None:
            data = self.inner.read(key, start, length)
            self._save(path, data)
        return data

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> builtins.list[bytes]:
        """Read ``(start, length)`` slices of one object, in the order given.

        Many or large ranges: one GET of the whole object, cached, then sliced. A few small
        ones: concurrent ranged GETs, each cached on its own.
        """
        ranges = list(ranges)
        if not ranges:
            return []
        if key.startswith(self.uncached_prefixes):
            return read_ranges(self.inner, key, ranges)
        whole = self._path(key, ".obj")
        cached = [self._load(whole, start, length) for start, length in ranges]
        if all(part is not None for part in cached):
            return cached  # type: ignore[return-value]  # checked just above
        size = None if len(ranges) > MAX_SEPARATE_RANGES else self.size(key)
        if _wants_whole(ranges, size):
            data = self._fetch_whole(key)
            return [data[start : start + length] for start, length in ranges]
        if len(ranges) == 1:
            return [self.read(key, *ranges[0])]
        with ThreadPoolExecutor(
            max_workers=min(RANGE_THREADS, len(ranges)), thread_name_prefix="trainguard-range"
        ) as pool:
            return list(pool.map(lambda item: self.read(key, item[0], item[1]), ranges))

    def exists(self, key: str) -> bool:
        return self._known_size(key) is not None or self.inner.exists(key)

    def size(self, key: str) -> int:
        size = self._known_size(key)
        if size is None:
            size = self.inner.size(key)
            if not key.startswith(self.uncached_prefixes):
                with self._sizes_lock:
                    self._sizes[key] = size
        return size

    # -- the cache itself -----------------------------------------------------------------------

    def _fetch_whole(self, key: str) -> bytes:
        data = self.inner.read(key)
        with self._sizes_lock:
            self._sizes[key] = len(data)
        self._save(self._path(key, ".obj"), data)
        return data

    def _known_size(self, key: str) -> int | None:
        if key.startswith(self.uncached_prefixes):
            return None
        with self._sizes_lock:
            size = self._sizes.get(key)
        if size is not None:
            return size
        try:
            with open(self._path(key, ".obj"), "rb") as file:
                header = self._header(file)
        except OSError:
            return None
        return None if header is None else header[0]

    def _path(self, key: str, suffix: str) -> Path:
        # Hashed names: keys may hold anything, and two keys must never share a cache file.
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest[2:]}{suffix}"

    @staticmethod
    def _header(file: BinaryIO) -> tuple[int, int] | None:
        """(length, crc32) from an open cache file's header, if the file holds that many bytes."""
        header = file.read(_HEADER.size)
        if len(header) != _HEADER.size:
            return None
        magic, length, crc = _HEADER.unpack(header)
        if magic != _MAGIC or os.fstat(file.fileno()).st_size != _HEADER.size + length:
            return None
        return length, crc

    def _load(self, path: Path, start: int = 0, length: int | None = None) -> bytes | None:
        """Cached bytes ``[start, start + length)`` of ``path``; None when absent or damaged."""
        try:
            with open(path, "rb") as file:
                header = self._header(file)
                if header is not None:
                    size, crc = header
                    if start == 0 and (length is None or length >= size):
                        data = file.read()
                        # Whole-file reads also check the CRC; slices trust the length check alone
                        # so that a small slice of a large object costs a small read.
                        if len(data) == size and zlib.crc32(data) == crc:
                            return data
                    else:
                        end = size if length is None else min(size, start + length)
                        file.seek(_HEADER.size + start)
                        return file.read(max(0, end - start))
        except FileNotFoundError:
            return None
        except OSError as error:
            logger.debug("cannot read cache file %s: %s", path, error)
            return None
        logger.debug("discarding damaged cache file %s", path)
        self._discard(path)
        return None

    def _save(self, path: Path, data: bytes) -> None:
        # The cache only saves time: a full or read-only disk must not fail the read itself.
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._label()
            descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(descriptor, "wb") as file:
                    file.write(_HEADER.pack(_MAGIC, len(data), zlib.crc32(data)))
                    file.write(data)
                os.replace(temp, path)
            except BaseException:
                os.unlink(temp)
                raise
        except OSError as error:
            logger.debug("cannot cache %s: %s", path, error)

    def _label(self) -> None:
        # A note naming the store, for whoever wonders what a hashed folder holds.
        if self._labelled:
            return
        self._labelled = True
        label = self.directory / "URL"
        if not label.exists():
            temp = label.with_name(f".URL.{os.getpid()}.{threading.get_ident()}.tmp")
            temp.write_text(self.inner.url + "\n", encoding="utf-8")
            os.replace(temp, label)

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            logger.debug("cannot remove cache file %s: %s", path, error)
