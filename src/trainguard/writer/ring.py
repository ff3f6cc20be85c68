"""The layout of the shared-memory ring between a training process (process.py, spawn.py) and
its writer process (child.py): both sides read and write the same bytes, so every offset, slot
and frame format is defined here once. Standard library only: the child imports it before
anything else of the writer's.

The ring file is ``HEADER_BYTES`` of header, then the data. The header starts with ``SLOTS``
little-endian uint64 counters (indexed by the ``SLOT_*`` names), then, from ``ERROR_OFFSET``,
the writer process's failure reason as NUL-terminated UTF-8 text. Messages go down the pipe as
frames: ``FRAME_HEAD`` (payload length, message number), then the pickled batch.
"""

from __future__ import annotations

import mmap
import struct

__all__ = [
    "ALIGN",
    "ERROR_BYTES",
    "ERROR_OFFSET",
    "FRAME_HEAD",
    "HEADER_BYTES",
    "SLOTS",
    "SLOT_BYTES_WRITTEN",
    "SLOT_FAILED",
    "SLOT_FAILED_STEP",
    "SLOT_FRAMES_DONE",
    "SLOT_READY",
    "SLOT_SEGMENT_BYTES_DONE",
    "SLOT_STEPS_WRITTEN",
    "SLOT_TAIL",
    "UNNAMED_IDLE_SECONDS",
    "read_error",
    "write_error",
]

HEADER_BYTES = 4096  # the ring's header (counters, the error text); data from here on
ALIGN = 64  # every tensor placed in the ring starts on a multiple of this

# Header counters (uint64 each).
SLOT_TAIL = 0  # ring bytes the writer process released (a position, only grows)
SLOT_FRAMES_DONE = 1  # messages fully handled
SLOT_FAILED = 2  # 1 once the writer process failed; the reason is at ERROR_OFFSET
SLOT_BYTES_WRITTEN = 3
SLOT_STEPS_WRITTEN = 4
SLOT_SEGMENT_BYTES_DONE = 5  # bytes of own-file tensors released
SLOT_READY = 6  # 1 once the writer process runs
SLOT_FAILED_STEP = 7  # the step being written when it failed, plus one (0: none)
SLOTS = 8

ERROR_OFFSET = 64  # after the counters
ERROR_BYTES = HEADER_BYTES - ERROR_OFFSET

FRAME_HEAD = struct.Struct("<IQ")  # payload length, message number

# A writer process started ahead that no save adopted (a script that imports torch and never
# trains, a launcher process) exits after this long; a hook adopts it only within the first 90 %.
UNNAMED_IDLE_SECONDS = 600.0


def write_error(ring: mmap.mmap, text: str) -> None:
    """Record ``text`` as the failure reason in a ring's header (cut to fit, NUL-terminated)."""
    encoded = text.encode(errors="replace")[: ERROR_BYTES - 1]
    ring[ERROR_OFFSET : ERROR_OFFSET + len(encoded) + 1] = encoded + b"\0"


def read_error(ring: mmap.mmap) -> str:
    """The failure reason :func:`write_error` recorded in a ring's header."""
    raw = bytes(ring[ERROR_OFFSET : ERROR_OFFSET + ERROR_BYTES])
    return raw.split(b"\0", 1)[0].decode(errors="replace")
