"""TFRecord framing as smdebug writes it.

A record is ``u64 length | u32 masked_crc32c(length bytes) | payload | u32 footer``, little-endian.
For event files under ``events/`` the footer is smdebug's constant :data:`MAGIC_FOOTER` (smdebug
1.0.34 rejects anything else); TensorBoard files carry the real payload CRC. Readers accept both.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from trainguard.errors import FormatError
from trainguard.format.crc32c import MAGIC_FOOTER, masked_crc32c

__all__ = ["HEADER_SIZE", "FOOTER_SIZE", "frame_header", "frame_footer", "frame", "parse_record", "iter_records"]

HEADER_SIZE = 12
FOOTER_SIZE = 4
_FOOTER_MAGIC_BYTES = struct.pack("<I", MAGIC_FOOTER)


def frame_header(payload_length: int) -> bytes:
    length = struct.pack("<Q", payload_length)
    return length + struct.pack("<I", masked_crc32c(length))


def frame_footer(payload: bytes | memoryview | None = None) -> bytes:
    """The constant smdebug footer, or the real payload CRC when ``payload`` is given."""
    if payload is None:
        return _FOOTER_MAGIC_BYTES
    return struct.pack("<I", masked_crc32c(payload))


def frame(payload: bytes, *, real_checksum: bool = False) -> bytes:
    """One whole framed record."""
    footer = frame_footer(payload if real_checksum else None)
    return frame_header(len(payload)) + payload + footer


def parse_record(data: bytes | memoryview, offset: int, path: str) -> tuple[memoryview, int]:
    """Parse the record at ``offset`` of ``data``; return (payload, offset of the next record).

    Raises FormatError naming ``path`` and the offset for a truncated or corrupt record.
    """
    view = memoryview(data)
    end = len(view)
    if end - offset < HEADER_SIZE:
        raise FormatError(path, offset, f"truncated record header ({end - offset} of {HEADER_SIZE} bytes)")
    length_bytes = bytes(view[offset : offset + 8])
    (length,) = struct.unpack("<Q", length_bytes)
    (length_crc,) = struct.unpack("<I", view[offset + 8 : offset + 12])
    if length_crc != masked_crc32c(length_bytes):
        raise FormatError(path, offset, "record length checksum mismatch (corrupt file)")
    payload_start = offset + HEADER_SIZE
    payload_end = payload_start + length
    if payload_end + FOOTER_SIZE > end:
        raise FormatError(
            path, offset, f"truncated record: needs {length + HEADER_SIZE + FOOTER_SIZE} bytes, {end - offset} left"
        )
    payload = view[payload_start:payload_end]
    footer = bytes(view[payload_end : payload_end + FOOTER_SIZE])
    if footer != _FOOTER_MAGIC_BYTES and struct.unpack("<I", footer)[0] != masked_crc32c(payload):
        raise FormatError(path, offset, "record payload checksum mismatch (corrupt file)")
    return payload, payload_end + FOOTER_SIZE


def iter_records(data: bytes | memoryview, path: str) -> Iterator[tuple[int, memoryview]]:
    """Yield (offset, payload) for every record of a whole file."""
    offset = 0
    while offset < len(data):
        payload, next_offset = parse_record(data, offset, path)
        yield offset, payload
        offset = next_offset
