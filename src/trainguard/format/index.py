"""Index files: which tensors an event file holds, at which byte ranges (smdebug's JSON layout)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainguard.errors import FormatError
from trainguard.modes import ModeKeys

__all__ = [
    "PAYLOAD_CHECKSUMS_META",
    "IndexEntry",
    "StepIndex",
    "declares_payload_checksums",
    "parse_index",
    "render_index",
]

# What a writer that checksums every payload says in its collections file's ``_meta`` (read
# before any step; smdebug ignores unknown ``_meta`` keys). A reader of such a run takes an
# index entry without ``crc32`` for corruption, not for a file written by smdebug: otherwise
# stripping the key from an index would make any altered payload trusted again.
PAYLOAD_CHECKSUMS_META: dict[str, object] = {"payload_checksums": "crc32"}


def declares_payload_checksums(meta: dict[str, object]) -> bool:
    """Whether a collections file's ``_meta`` says its writer checksums every payload."""
    return meta.get("payload_checksums") == PAYLOAD_CHECKSUMS_META["payload_checksums"]


@dataclass(frozen=True)
class IndexEntry:
    tensor_name: str
    start: int  # byte offset of the framed record in the event file
    length: int  # framed length: header + payload + footer
    # zlib CRC-32 of the record's payload, written by trainguard under the extra key "crc32".
    # smdebug 1.0.34 must find its constant in the record footer (it rejects a real checksum
    # there), so the payload's checksum lives in the index, where smdebug ignores unknown keys.
    # None for files written by smdebug or older trainguard versions, and, in a run whose
    # collections file declares PAYLOAD_CHECKSUMS_META, for an altered or damaged index.
    checksum: int | None = None


@dataclass
class StepIndex:
    step: int
    worker: str
    mode: ModeKeys
    mode_step: int
    event_file: str | None  # key relative to the run root
    tensors: list[IndexEntry] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _payload_entry(entry: IndexEntry) -> dict[str, object]:
    item: dict[str, object] = {"tensorname": entry.tensor_name, "start_idx": entry.start, "length": entry.length}
    if entry.checksum is not None:
        item["crc32"] = entry.checksum
    return item


def _checksum(item: dict) -> int | None:
    value = item.get("crc32")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise ValueError(f"crc32 of {item.get('tensorname')!r} is not a 32-bit checksum")
    return value


def render_index(index: StepIndex) -> bytes:
    """The JSON smdebug 1.0.34 writes (and reads)."""
    meta: dict[str, object] = {"mode": index.mode.name, "mode_step": index.mode_step}
    if index.event_file is not None:
        meta["event_file_name"] = index.event_file
    document = {
        "meta": meta,
        "tensor_payload": [_payload_entry(entry) for entry in index.tensors],
        "shape_payload": [
            {"tensorname": name, "originalname": name, "shape": list(shape)} for name, shape in index.shapes.items()
        ],
    }
    return json.dumps(document).encode("utf-8")


def parse_index(data: bytes, *, step: int, worker: str, path: str) -> StepIndex:
    """Parse and validate an index file. Step and worker come from its name, as in smdebug."""
    try:
        document = json.loads(data)
        meta = document["meta"]
        if not isinstance(meta, dict) or not meta:
            raise ValueError("empty meta")
        if "tensor_payload" not in document and "shape_payload" not in document:
            raise ValueError("neither tensor_payload nor shape_payload")
        mode = ModeKeys[str(meta.get("mode", "GLOBAL")).strip()]
        mode_step = int(meta.get("mode_step", step))
        entries = [
            IndexEntry(str(item["tensorname"]), int(item["start_idx"]), int(item["length"]), _checksum(item))
            for item in document.get("tensor_payload") or []
        ]
        shapes = {
            str(item["tensorname"]): tuple(int(size) for size in item["shape"])
            for item in document.get("shape_payload") or []
        }
    except (ValueError, KeyError, TypeError) as error:
        raise FormatError(path, 0, f"corrupt index file: {error}") from None
    return StepIndex(
        step=step,
        worker=worker,
        mode=mode,
        mode_step=mode_step,
        event_file=meta.get("event_file_name"),
        tensors=entries,
        shapes=shapes,
    )
