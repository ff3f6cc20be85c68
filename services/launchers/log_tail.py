"""Reading the end of a component's log without reading the rest of it.

A running job's log is read on every describe (its metrics, its failure reason) and by the
reconciler; a job that has printed a gigabyte must not cost a gigabyte of reads each time. A tail is
read backwards from the end in blocks until it holds the lines asked for, and never more than a
byte bound.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_TAIL_BYTES", "read_log"]

# The most a tail read reads; a tail whose lines are longer than this starts mid-line.
MAX_TAIL_BYTES = 8 * 1024 * 1024
_BLOCK_BYTES = 64 * 1024


def read_log(
    path: Path, tail: int | None = None, *, max_bytes: int = MAX_TAIL_BYTES, block_bytes: int = _BLOCK_BYTES
) -> str:
    """The log at ``path`` ("" when there is none): all of it, or its last ``tail`` lines.

    The text is what reading the file as text gives (``\\r\\n`` and ``\\r`` read as ``\\n``, so
    progress updates are lines), and a tail the same lines as splitting all of it would give,
    within the last ``max_bytes``.
    """
    if tail is not None and tail <= 0:
        return ""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below; a missing log is no error
    except FileNotFoundError:
        return ""
    with handle:
        if tail is None:
            return _text(handle.read())
        return _tail(handle.fileno(), tail, max_bytes, block_bytes)


def _tail(descriptor: int, tail: int, max_bytes: int, block_bytes: int) -> str:
    position = os.fstat(descriptor).st_size
    blocks: list[bytes] = []
    newlines = read = 0
    # Every b"\n" ends at least one line (alone or in \r\n), so tail + 1 of them guarantee tail
    # whole lines after the first, which may have begun before what was read.
    while position > 0 and newlines <= tail and read < max_bytes:
        size = min(block_bytes, position, max_bytes - read)
        position -= size
        block = os.pread(descriptor, size, position)
        if not block:
            break  # truncated while read: what was read is the tail
        blocks.append(block)
        newlines += block.count(b"\n")
        read += len(block)
    data = b"".join(reversed(blocks))
    lines = _text(data).splitlines(keepends=True)
    if position > 0:
        if newlines > tail:
            lines = lines[1:]  # begun before the read: the lines kept are whole without it
        else:
            # The byte bound cut the read: keep the newest text, from a whole character on.
            start = next((i for i, byte in enumerate(data[:4]) if byte & 0xC0 != 0x80), 0)
            lines = _text(data[start:]).splitlines(keepends=True)
    return "".join(lines[-tail:])


def _text(data: bytes) -> str:
    """``data`` as ``open(..., errors="replace")`` reads it (universal newlines)."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
