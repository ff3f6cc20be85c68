"""Reading records out of a run's event files: the byte ranges an index names, with one whole
read (mapped, for local files) when many are wanted, and a short wait for an event file an index
names before it is there."""

from __future__ import annotations

import logging
import time

from trainguard.errors import ObjectNotFound, TensorUnavailableForStep
from trainguard.storage.base import Store
from trainguard.storage.cache import MAX_SEPARATE_RANGES, WHOLE_OBJECT_FRACTION, read_ranges

__all__ = ["EventReads"]

logger = logging.getLogger("trainguard")


class EventReads:
    """Ranged reads of one run's event files.

    ``missing`` collects the event files an index named that were still absent after the wait
    (the trial reports them as damage); each is waited for once.
    """

    def __init__(self, store: Store, path: str, missing_event_wait: float, missing: set[str]) -> None:
        self.store = store
        self.path = path
        self.missing_event_wait = missing_event_wait
        self.missing = missing

    def read(self, event_file: str, ranges: list[tuple[int, int]]) -> tuple[list[memoryview], int]:
        """The records at ``ranges`` as views of what was read, and the size of the buffer they
        share when one whole-file read served them all (many records wanted: one read, no
        per-record copy), else 0."""
        # The index is written after its event file, but on eventually consistent stores or
        # with several writers the event file can lag a moment: retry briefly, never forever,
        # and only once per file (a report reads a step many times).
        wait = 0.0 if event_file in self.missing else self.missing_event_wait
        deadline = time.monotonic() + wait
        while True:
            try:
                return self._read_slices(event_file, ranges)
            except ObjectNotFound:
                if time.monotonic() >= deadline:
                    message = f"{self.path}/{event_file} is listed in an index but does not exist (waited {wait:.0f} s)"
                    if event_file not in self.missing:
                        self.missing.add(event_file)
                        logger.warning("trainguard: %s", message)
                    raise TensorUnavailableForStep(message) from None
                time.sleep(0.2)

    def _read_slices(self, key: str, ranges: list[tuple[int, int]]) -> tuple[list[memoryview], int]:
        if getattr(self.store, "read_ranges", None) is None and ranges:
            # read_ranges' own choice between one whole read and separate ones, without its
            # per-range copies of the whole object
            many = len(ranges) > MAX_SEPARATE_RANGES
            if many or sum(length for _, length in ranges) > WHOLE_OBJECT_FRACTION * self.store.size(key):
                read_mapped = getattr(self.store, "read_mapped", None)  # local files: no copy
                data = read_mapped(key) if read_mapped is not None else memoryview(self.store.read(key))
                return [data[start : start + length] for start, length in ranges], len(data)
        # each record its own buffer: nothing to copy out of (buffer size 0)
        return [memoryview(chunk) for chunk in read_ranges(self.store, key, ranges)], 0
