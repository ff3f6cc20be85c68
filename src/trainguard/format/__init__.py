"""The on-disk format, compatible both ways with smdebug 1.0.34. Pure encoding; no I/O.

The names below are loaded on first use (PEP 562): ``trainguard run`` and the hook's bootstrap
read only ``trainguard.format.layout`` (paths and marker names), and importing the codecs here
would load numpy and protobuf into a process that starts before training and never decodes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers and editors see the names; the interpreter loads them on use
    from trainguard.format.index import (
        IndexEntry,
        StepIndex,
        declares_payload_checksums,
        parse_index,
        render_index,
    )
    from trainguard.format.record import frame, iter_records, parse_record
    from trainguard.format.tensor_codec import DecodedTensor, EncodedTensor, decode_event, encode_tensor_event

_HOME = {
    "declares_payload_checksums": "index",
    "IndexEntry": "index",
    "StepIndex": "index",
    "parse_index": "index",
    "render_index": "index",
    "frame": "record",
    "iter_records": "record",
    "parse_record": "record",
    "DecodedTensor": "tensor_codec",
    "EncodedTensor": "tensor_codec",
    "decode_event": "tensor_codec",
    "encode_tensor_event": "tensor_codec",
    "saved_dtype": "tensor_codec",
}

__all__ = [
    "DecodedTensor",
    "EncodedTensor",
    "IndexEntry",
    "StepIndex",
    "declares_payload_checksums",
    "decode_event",
    "encode_tensor_event",
    "frame",
    "iter_records",
    "parse_index",
    "parse_record",
    "render_index",
    "saved_dtype",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
