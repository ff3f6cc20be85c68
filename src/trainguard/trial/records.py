"""One tensor record out of a buffer read from an event file."""

from __future__ import annotations

import zlib

import numpy as np

from trainguard.errors import ChecksumMissing, FormatError
from trainguard.format.fast_decode import decode_tensor_event
from trainguard.format.record import parse_record

__all__ = ["PIN_FRACTION", "decode_record"]

# A record read as part of a larger buffer (a whole event file) is copied out of it when it is
# less than 1/this of the buffer: the array of a small tensor would otherwise keep the whole file
# alive, and a caller keeping, say, one scalar per step must not hold every step's file.
# Copying a small record costs little; large ones stay views of the buffer (no copy at all).
PIN_FRACTION = 16


def decode_record(
    chunk: memoryview,
    start: int,
    length: int,
    buffer_size: int,
    path: str,
    checksum: int | None = None,
    *,
    checksum_required: bool = False,
) -> np.ndarray:
    """The array of the framed record ``chunk`` (index entry ``start``/``length`` of ``path``).

    ``checksum`` is the index's CRC-32 of the payload, when the writer recorded one;
    ``checksum_required``: the run's writer checksums every payload, so a missing one is damage.
    """
    if checksum is None and checksum_required:
        raise ChecksumMissing(
            path, start, "its index entry has no crc32 although this run checksums every payload "
            "(the index was altered or damaged): the value cannot be trusted",
        )  # fmt: skip
    if len(chunk) != length:
        raise FormatError(path, start, f"file ends before the {length}-byte record the index names")
    payload, _ = parse_record(chunk, 0, path)
    if checksum is not None and zlib.crc32(payload) != checksum:
        raise FormatError(path, start, "record payload does not match its checksum in the index (corrupt file)")
    if len(payload) * PIN_FRACTION < buffer_size:
        return decode_tensor_event(bytes(payload), path, start).value
    return decode_tensor_event(payload, path, start).value
