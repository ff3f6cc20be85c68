"""Index files: which tensors an event file holds, at which byte ranges (smdebug's JSON layout)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainguard.errors import FormatError
from trainguard.modes import ModeKeys

__all__ = ["IndexEntry", "StepIndex", "parse_index", "render_index"]


@dataclass(frozen=True)
class IndexEntry:
    tensor_name: str
    start: int  # byte offset of the framed record in the event file
    length: int  # framed length: header + payload + footer


@dataclass
class StepIndex:
    step: int
    worker: str
    mode: ModeKeys
    mode_step: int
    event_file: str | None  # key relative to the run root
    tensors: list[IndexEntry] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def render_index(index: StepIndex) -> bytes:
    """The JSON smdebug 1.0.34 writes (and reads)."""
    meta: dict[str, object] = {"mode": index.mode.name, "mode_step": index.mode_step}
    if index.event_file is not None:
        meta["event_file_name"] = index.event_file
    document = {
        "meta": meta,
        "tensor_payload": [
            {"tensorname": entry.tensor_name, "start_idx": entry.start, "length": entry.length}
            for entry in index.tensors
        ],
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
            IndexEntry(str(item["tensorname"]), int(item["start_idx"]), int(item["length"]))
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
