"""One worker's steps as event files and indexes: the part of writing that both writers share.

The thread writer (thread.py) and the writer process (child.py) hand it arrays in the
order they arrived; it frames and checksums records, commits a step's event file before its
index (a reader that sees an index always finds the event file it names) and counts what it
wrote. It does no threading and no waiting of its own.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from trainguard.format.index import IndexEntry, StepIndex, render_index
from trainguard.format.layout import event_key, index_key
from trainguard.format.record import FOOTER_SIZE, HEADER_SIZE, frame_footer, frame_header
from trainguard.format.tensor_codec import encode_scalar_events, encode_tensor_event
from trainguard.modes import ModeKeys
from trainguard.storage.base import Store, StoreWriter

__all__ = ["StepFile"]

_FOOTER = frame_footer()
# Record headers by payload length: scalar records of a run repeat a handful of lengths.
_HEADERS: dict[int, bytes] = {}


def _no_pause() -> None:
    pass


class StepFile:
    """Writes the open step's records, then its index; one step at a time."""

    def __init__(self, store: Store, worker: str, *, pause: Callable[[], None] = _no_pause) -> None:
        self.store = store
        self.worker = worker
        # Called after each record: the thread writer hands the GIL back to training there.
        self._pause = pause
        self.bytes_written = 0
        self.steps_written = 0
        self._step: tuple[int, ModeKeys, int] | None = None
        self._file: StoreWriter | None = None
        self._offset = 0
        self._entries: list[IndexEntry] = []
        self._ending: int | None = None  # the step whose end() failed: still the one being written

    @property
    def open(self) -> bool:
        return self._step is not None

    @property
    def step(self) -> int | None:
        """The open step's number (or the one whose end failed: the step capture stopped at)."""
        return self._ending if self._step is None else self._step[0]

    def begin(self, step: int, mode: ModeKeys, mode_step: int) -> None:
        if self._step is not None:  # a step left open: finish it rather than lose it
            self.end()
        self._step = (step, mode, mode_step)
        self._ending = None
        self._file = None
        self._offset = 0
        self._entries = []

    def _writer(self) -> StoreWriter:
        if self._file is None:
            assert self._step is not None
            self._file = self.store.open_writer(event_key(self._step[0], self.worker))
        return self._file

    def tensor(self, name: str, array: np.ndarray, proto_dtype: int | None = None) -> None:
        if self._step is None:
            return
        step, mode, mode_step = self._step
        encoded = encode_tensor_event(
            name, array, step=step, mode=mode, mode_step=mode_step, wall_time=time.time(), proto_dtype=proto_dtype
        )
        file = self._writer()
        file.write(frame_header(encoded.length))
        file.write(encoded.prefix)
        if encoded.content.nbytes:
            file.write(encoded.content)
        file.write(_FOOTER)
        record_length = HEADER_SIZE + encoded.length + FOOTER_SIZE
        # The payload's checksum goes in the index (see IndexEntry.checksum): a flipped byte is
        # then a clear error on read, never a silently wrong value. zlib's CRC-32 is in C, always
        # installed, and drops the GIL on large buffers.
        checksum = zlib.crc32(encoded.prefix)
        if encoded.content.nbytes:
            checksum = zlib.crc32(encoded.content, checksum)
        self._entries.append(IndexEntry(name, self._offset, record_length, checksum))
        self._offset += record_length
        self._pause()

    def scalars(self, names: Sequence[str], values: np.ndarray) -> None:
        """A batch of scalar records (reductions) in one buffer and one write."""
        if self._step is None or not names:
            return
        step, mode, mode_step = self._step
        payloads = encode_scalar_events(names, values, step=step, mode=mode, mode_step=mode_step, wall_time=time.time())
        buffer = bytearray()
        for name, payload in zip(names, payloads, strict=True):
            header = _HEADERS.get(len(payload))
            if header is None:
                header = _HEADERS.setdefault(len(payload), frame_header(len(payload)))
            buffer += header
            buffer += payload
            buffer += _FOOTER
            record_length = HEADER_SIZE + len(payload) + FOOTER_SIZE
            self._entries.append(IndexEntry(name, self._offset, record_length, zlib.crc32(payload)))
            self._offset += record_length
        self._writer().write(bytes(buffer))
        self._pause()

    def end(self) -> None:
        """Commit the event file, then the index. A step with no record writes nothing."""
        step, self._step = self._step, None
        file, self._file = self._file, None
        if step is None or file is None:
            return
        self._ending = step[0]
        file.commit()  # the event file first: an index must never name a missing file
        index = StepIndex(
            step=step[0],
            worker=self.worker,
            mode=step[1],
            mode_step=step[2],
            event_file=event_key(step[0], self.worker),
            tensors=self._entries,
        )
        try:
            self.store.write(index_key(step[0], self.worker), render_index(index))
        except BaseException:
            # No index (a full disk): the event file alone would read as a damaged step, and
            # deleting it gives the space back. The step was simply not captured.
            try:
                self.store.delete(event_key(step[0], self.worker))
            except Exception:  # noqa: BLE001 - the index failure is the one reported
                pass
            raise
        self._ending = None
        self.bytes_written += self._offset
        self.steps_written += 1

    def abort(self) -> None:
        """Drop the open step: its event file is deleted, no index is written."""
        file, self._file = self._file, None
        self._step = None
        if file is not None:
            file.abort()

    def abort_quietly(self) -> None:
        """After a failure: drop the open step, ignoring a second failure on the way."""
        try:
            self.abort()
        except Exception:  # noqa: BLE001 - the first failure is the one reported
            self._file = None
            self._step = None
